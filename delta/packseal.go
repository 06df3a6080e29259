package delta

// Converting packs between the plaintext and the sealed layout, for a home
// whose local store is plaintext (--encrypt-local=false) and whose remote
// store is sealed (docs/FORMAT.md, "Encrypted stores"). The plaintext pack
// names both copies: its keyed ID reveals nothing without the data key.
// Blobs keep their order, so the plaintext layout is a function of the
// sealed one and a round trip gives the very bytes the name was hashed
// from, which the reader checks.

import (
	"fmt"
)

// SealPack returns the sealed form of the plaintext pack plain: every blob
// and the header sealed by k, in the same order. The result is a sealed
// pack as k.NewPackWriter writes one (any name; the caller keeps plain's).
func (k *Keys) SealPack(plain []byte) ([]byte, error) {
	entries, err := ParsePackHeader(plain)
	if err != nil {
		return nil, err
	}
	w := NewPackWriterFor(k, k.IDs())
	w.Reserve(len(plain) + (len(entries)+2)*SealOverhead)
	for _, e := range entries {
		w.Add(e.Type, e.ID, plain[e.Offset:e.Offset+e.Length], int(e.RawLength), e.Compression)
	}
	data, _, _, err := w.Finish()
	return data, err
}

// UnsealPack returns the plaintext pack holding the blobs of the sealed
// pack sealed, in its order, as a plaintext pack writer would have written
// it. Every blob is authenticated on the way.
func (k *Keys) UnsealPack(sealed []byte) ([]byte, error) {
	entries, err := k.ParsePackHeader(sealed)
	if err != nil {
		return nil, err
	}
	w := NewPackWriterFor(nil, k.IDs())
	w.Reserve(len(sealed))
	for _, e := range entries {
		stored, err := k.OpenBlob(e.Type, e.ID, sealed[e.Offset:e.Offset+e.Length])
		if err != nil {
			return nil, err
		}
		w.Add(e.Type, e.ID, stored, int(e.RawLength), e.Compression)
	}
	data, _, _, err := w.Finish()
	return data, err
}

// PlainPackTail returns, for the entries of a sealed pack (as
// k.ReadPackHeader gives them), where the plaintext layout's header starts
// and its header and footer bytes: what a reader of the plaintext pack's
// end gets, without reading a blob.
func (k *Keys) PlainPackTail(sealed []PackEntry) (dataLen int64, tail []byte, err error) {
	plain := make([]PackEntry, len(sealed))
	var off uint64
	for i, e := range sealed {
		if e.Length < SealOverhead {
			return 0, nil, corrupt("blob %s: %d sealed bytes, less than the seal's overhead", e.ID, e.Length)
		}
		e.Offset, e.Length = off, e.Length-SealOverhead
		off += e.Length
		plain[i] = e
	}
	tail = appendHeader(nil, plain)
	tail = (*Keys)(nil).appendFooter(tail, len(tail))
	return int64(off), tail, nil
}

// CheckPackName checks that pack data (sealed by k, or plaintext for nil
// k) is the pack named id under ids: a sealed pack is named by its own
// bytes when a home with an encrypted local store wrote it, and by its
// plaintext layout when one with a plaintext local store did. It returns
// the plaintext layout when that is what matched (nil otherwise).
func (k *Keys) CheckPackName(ids IDs, id ID, data []byte) ([]byte, error) {
	if ids.Hash(data) == id {
		return nil, nil
	}
	if k != nil && len(data) >= packFooterSize && string(data[len(data)-4:]) == sealedMagic {
		plain, err := k.UnsealPack(data)
		if err != nil {
			return nil, fmt.Errorf("pack %s: %w", id, err)
		}
		if ids.Hash(plain) == id {
			return plain, nil
		}
	}
	return nil, corrupt("pack %s: content hashes to %s (%s IDs)", id, ids.Hash(data).Short(), ids.Scheme())
}
