package btrfs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// recKey names a directory inode across renames: its number and the
// transaction that created it (numbers are reused after a remount).
type recKey struct {
	Ino uint64 `json:"ino"`
	Gen uint64 `json:"gen"`
}

// kid is what a record keeps about a child directory.
type kid struct {
	Ino, Gen uint64
	Key      delta.ID // state key of its subtree
	// Residue marks a merged directory that differs from the base's only in
	// its mtime and has nothing below it: left out of the state key.
	Residue bool
}

// record is one directory of the writable layer as last scanned.
type record struct {
	Ino, Gen uint64
	Path     string // root-relative, "" for the root
	Full     bool   // listed in full (new or replacing), not merged with the base
	Tree     []byte // the encoded delta.Tree of its layer entries
	Kids     map[string]kid

	decoded *delta.Tree
}

func (r *record) key() recKey { return recKey{r.Ino, r.Gen} }

// tree returns the decoded listing.
func (r *record) tree() (*delta.Tree, error) {
	if r.decoded == nil {
		t, err := delta.DecodeTree(r.Tree)
		if err != nil {
			return nil, err
		}
		r.decoded = t
	}
	return r.decoded, nil
}

var recordMagic = []byte{'T', 'S', 'R', 1}

func (r *record) encode() []byte {
	b := slices.Clone(recordMagic)
	b = binary.AppendUvarint(b, r.Ino)
	b = binary.AppendUvarint(b, r.Gen)
	b = binary.AppendUvarint(b, uint64(len(r.Path)))
	b = append(b, r.Path...)
	if r.Full {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Tree)))
	b = append(b, r.Tree...)
	names := make([]string, 0, len(r.Kids))
	for n := range r.Kids {
		names = append(names, n)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, n := range names {
		k := r.Kids[n]
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
		b = binary.AppendUvarint(b, k.Ino)
		b = binary.AppendUvarint(b, k.Gen)
		b = append(b, k.Key[:]...)
		if k.Residue {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	sum := delta.Hash(b)
	return append(b, sum[:]...)
}

func decodeRecord(b []byte) (*record, error) {
	bad := func(what string) error { return fmt.Errorf("scan record: %s: %w", what, errdefs.ErrCorrupt) }
	if len(b) < len(recordMagic)+32 || !bytes.HasPrefix(b, recordMagic) {
		return nil, bad("bad magic")
	}
	body, sum := b[:len(b)-32], b[len(b)-32:]
	if h := delta.Hash(body); !bytes.Equal(h[:], sum) {
		return nil, bad("checksum mismatch")
	}
	d := body[len(recordMagic):]
	fail := false
	uv := func() uint64 {
		v, n := binary.Uvarint(d)
		if n <= 0 {
			fail = true
			return 0
		}
		d = d[n:]
		return v
	}
	bytesN := func() []byte {
		n := uv()
		if fail || n > uint64(len(d)) {
			fail = true
			return nil
		}
		s := d[:n]
		d = d[n:]
		return s
	}
	r := &record{Ino: uv(), Gen: uv()}
	r.Path = string(bytesN())
	if fail || len(d) < 1 {
		return nil, bad("truncated")
	}
	r.Full, d = d[0] == 1, d[1:]
	r.Tree = slices.Clone(bytesN())
	nk := uv()
	if fail || nk > uint64(len(d)) {
		return nil, bad("truncated")
	}
	r.Kids = make(map[string]kid, nk)
	for range nk {
		name := string(bytesN())
		k := kid{Ino: uv(), Gen: uv()}
		if fail || len(d) < 33 {
			return nil, bad("truncated kid")
		}
		copy(k.Key[:], d)
		k.Residue = d[32] == 1
		d = d[33:]
		r.Kids[name] = k
	}
	if fail || len(d) != 0 {
		return nil, bad("trailing bytes")
	}
	return r, nil
}
