package delta

// Encryption at rest (docs/FORMAT.md, "Encrypted stores").
//
// A master key (a key file, kept off the store) wraps one repository data
// key, stored in the store under keys/<key id>. The data key seals every
// object: packs blob by blob plus their header (so one blob is still read
// by range), every other object whole. Rotating the master key rewraps
// the data key; no object is rewritten.
//
// The AEAD is XChaCha20-Poly1305 (golang.org/x/crypto/chacha20poly1305):
// its 192-bit nonces can be drawn at random by every host writing with the
// same data key, with no counter to coordinate and no birthday bound to
// watch (AES-GCM's 96-bit random nonces allow about 2^32 messages per key,
// which a busy repository of 64 KiB chunks reaches), and it runs in
// constant time without AES instructions.

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/zeebo/blake3"
	"golang.org/x/crypto/chacha20poly1305"
)

// KeyPrefix starts the names of the wrapped data keys in a store.
const KeyPrefix = "keys/"

const (
	// KeySize is the size of master and data keys.
	KeySize = 32
	// SealOverhead is what sealing adds to every sealed blob, header and
	// object: the nonce and the Poly1305 tag.
	SealOverhead = chacha20poly1305.NonceSizeX + chacha20poly1305.Overhead
	// maxKeyFile bounds a key file or key object read.
	maxKeyFile = 4 << 10

	keyFileKind  = "turnsnap-master-key"
	objectMagic  = "TSX1" // a whole sealed object
	sealedMagic  = "TSE1" // a sealed pack's footer
	adBlob       = "turnsnap/blob/v1"
	adHeader     = "turnsnap/pack-header/v1"
	adDataKey    = "turnsnap/data-key/v1"
	ctxKEK       = "turnsnap 2026-12 master key wrapping v1"
	ctxKeyID     = "turnsnap 2026-12 master key id v1"
	ctxObjectKey = "turnsnap 2026-12 object sealing v1"
	ctxCatalog   = "turnsnap 2026-12 local catalog v1"
	ctxIDs       = "turnsnap 2026-12 content ids v1"
)

// keyError is a missing or wrong key, wrapping errdefs.ErrKey.
func keyError(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrKey)
}

// Keys is a repository's unwrapped data key. A nil *Keys is a plaintext
// repository: every method then passes bytes through or refuses sealed ones.
// Keys is safe for concurrent use.
type Keys struct {
	dataKey [KeySize]byte
	objects aeadSealer
	catalog [KeySize]byte
	ids     IDs // the store's content ID scheme (keyed, unless the store predates keyed IDs)
}

// aeadSealer is the part of cipher.AEAD sealing needs.
type aeadSealer interface {
	Seal(dst, nonce, plaintext, additionalData []byte) []byte
	Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error)
}

func newKeys(dataKey [KeySize]byte, keyedIDs bool) *Keys {
	k := &Keys{dataKey: dataKey}
	if keyedIDs {
		// Derived from the data key, which rotation keeps: IDs never change.
		var ik [KeySize]byte
		blake3.DeriveKey(ctxIDs, dataKey[:], ik[:])
		k.ids = KeyedIDs(ik)
	}
	var ok [KeySize]byte
	blake3.DeriveKey(ctxObjectKey, dataKey[:], ok[:])
	aead, err := chacha20poly1305.NewX(ok[:])
	if err != nil {
		panic(err) // only a wrong key size, which KeySize rules out
	}
	k.objects = aead
	blake3.DeriveKey(ctxCatalog, dataKey[:], k.catalog[:])
	return k
}

// NewDataKey draws a fresh repository data key, whose store names content
// with keyed IDs.
func NewDataKey() *Keys {
	var dk [KeySize]byte
	if _, err := rand.Read(dk[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return newKeys(dk, true)
}

// NewDataKeyPlainIDs draws a data key whose store names content with
// plain BLAKE3, as encrypted stores made before keyed IDs do: for tests of
// such stores, never for a new one.
func NewDataKeyPlainIDs() *Keys {
	k := NewDataKey()
	return newKeys(k.dataKey, false)
}

// IDs returns the content ID scheme of the store k opens: keyed BLAKE3
// with a key derived from the data key, or plain BLAKE3 for a plaintext
// store (nil k) and for an encrypted store made before keyed IDs.
func (k *Keys) IDs() IDs {
	if k == nil {
		return IDs{}
	}
	return k.ids
}

// CatalogKey is the key the local catalog (Badger) encrypts its files with,
// derived from the data key so that it changes with nothing but the data.
func (k *Keys) CatalogKey() []byte {
	if k == nil {
		return nil
	}
	return bytes.Clone(k.catalog[:])
}

// seal appends nonce || AEAD(plain) to dst.
func (k *Keys) seal(dst, plain, ad []byte) []byte {
	var nonce [chacha20poly1305.NonceSizeX]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		panic(err)
	}
	dst = append(dst, nonce[:]...)
	return k.objects.Seal(dst, nonce[:], plain, ad)
}

// open checks and decrypts nonce || AEAD. Any failure means the bytes were
// not sealed by this key for this place: a wrong key (when nothing opens)
// or tampering; callers say which they can tell.
func (k *Keys) open(sealed, ad []byte) ([]byte, error) {
	if len(sealed) < SealOverhead {
		return nil, errors.New("too short to be sealed")
	}
	n := chacha20poly1305.NonceSizeX
	plain, err := k.objects.Open(nil, sealed[:n], sealed[n:], ad)
	if err != nil {
		return nil, errors.New("authentication failed")
	}
	return plain, nil
}

func blobAD(t BlobType, id ID) []byte {
	ad := make([]byte, 0, len(adBlob)+1+len(id))
	ad = append(ad, adBlob...)
	ad = append(ad, byte(t))
	return append(ad, id[:]...)
}

// OpenBlob turns the sealed bytes of blob id, as a pack entry locates them,
// back into its stored form (compressed or not). The tag binds the blob's
// type and ID, so a blob moved to another entry does not open. With nil
// Keys, sealed is returned as is.
func (k *Keys) OpenBlob(t BlobType, id ID, sealed []byte) ([]byte, error) {
	if k == nil {
		return sealed, nil
	}
	out, err := k.open(sealed, blobAD(t, id))
	if err != nil {
		return nil, corrupt("blob %s: sealed bytes: %v", id, err)
	}
	return out, nil
}

// SealedName reports whether objects under name are sealed whole in an
// encrypted store: everything but packs (sealed blob by blob, see
// PackWriter) and the wrapped keys (sealed by the master key).
func SealedName(name string) bool {
	return !strings.HasPrefix(name, PackPrefix) && !strings.HasPrefix(name, KeyPrefix)
}

// SealObject returns the sealed form of the object stored under name:
// "TSX1" || nonce || AEAD(plain), the tag binding name, so that one
// sandbox's ref cannot be passed off as another's.
func (k *Keys) SealObject(name string, plain []byte) []byte {
	out := append(make([]byte, 0, len(objectMagic)+SealOverhead+len(plain)), objectMagic...)
	return k.seal(out, plain, []byte(objectMagic+name))
}

// OpenObject is the inverse of SealObject. Plaintext objects in an
// encrypted store are refused: a writer without the key must not be able
// to plant them.
func (k *Keys) OpenObject(name string, sealed []byte) ([]byte, error) {
	rest, ok := bytes.CutPrefix(sealed, []byte(objectMagic))
	if !ok {
		return nil, corrupt("object %s: not sealed (no %q magic) in an encrypted store", name, objectMagic)
	}
	plain, err := k.open(rest, []byte(objectMagic+name))
	if err != nil {
		return nil, keyError("object %s: %v: the store's data key does not open it (a wrong key, or tampering)", name, err)
	}
	return plain, nil
}

// IsSealedObject reports whether data starts like a sealed object, so a
// reader without a key can say "encrypted" instead of "corrupt".
func IsSealedObject(data []byte) bool { return bytes.HasPrefix(data, []byte(objectMagic)) }

// MasterKey is the secret of a key file: it wraps the data key and never
// reaches the store.
type MasterKey struct{ key [KeySize]byte }

// GenerateMasterKey draws a fresh master key.
func GenerateMasterKey() *MasterKey {
	m := &MasterKey{}
	if _, err := rand.Read(m.key[:]); err != nil {
		panic(err)
	}
	return m
}

// ID names the master key without revealing it: the first 16 bytes of a
// BLAKE3 key derivation from it, in hex. The data key it wraps is stored
// under KeyName(m.ID()).
func (m *MasterKey) ID() string {
	var id [16]byte
	blake3.DeriveKey(ctxKeyID, m.key[:], id[:])
	return hex.EncodeToString(id[:])
}

// KeyName returns the store name of the data key wrapped by master key id.
func KeyName(id string) string { return KeyPrefix + id }

type keyFile struct {
	Version int    `json:"version"`
	Kind    string `json:"kind"`
	Key     string `json:"key"`
}

// EncodeKeyFile returns the bytes of a key file holding m (JSON, the key in
// base64). Write it with mode 0600.
func EncodeKeyFile(m *MasterKey) []byte {
	b, _ := json.Marshal(keyFile{Version: 1, Kind: keyFileKind, Key: base64.StdEncoding.EncodeToString(m.key[:])})
	return append(b, '\n')
}

// DecodeKeyFile parses a key file. Anything but a version 1 turnsnap master
// key of exactly KeySize bytes is refused.
func DecodeKeyFile(data []byte) (*MasterKey, error) {
	if len(data) > maxKeyFile {
		return nil, keyError("key file: %d bytes, more than a key file holds", len(data))
	}
	var f keyFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, keyError("key file: not a turnsnap key file: %v", err)
	}
	if f.Kind != keyFileKind || f.Version != 1 {
		return nil, keyError("key file: kind %q version %d, want %q version 1", f.Kind, f.Version, keyFileKind)
	}
	raw, err := base64.StdEncoding.DecodeString(f.Key)
	if err != nil || len(raw) != KeySize {
		return nil, keyError("key file: the key is not %d bytes of base64", KeySize)
	}
	m := &MasterKey{}
	copy(m.key[:], raw)
	return m, nil
}

// keyObject is the JSON of keys/<id>: the data key sealed by a key
// derived from the master key.
type keyObject struct {
	Version int    `json:"version"`
	Sealed  []byte `json:"sealed"` // nonce || XChaCha20-Poly1305(KEK, data key)
	// IDs is the store's content ID scheme, SchemeKeyed or absent (plain:
	// a store made before keyed IDs). It is bound into the tag, so it
	// cannot be changed without the master key.
	IDs string `json:"ids,omitempty"`
}

// keyAD is the associated data of a wrapped data key: a plain-ID store's
// is what it was before keyed IDs, so its key objects still open.
func keyAD(keyID, ids string) []byte {
	if ids == "" {
		return []byte(adDataKey + keyID)
	}
	return []byte(adDataKey + keyID + "/ids=" + ids)
}

func (m *MasterKey) kek() aeadSealer {
	var kek [KeySize]byte
	blake3.DeriveKey(ctxKEK, m.key[:], kek[:])
	aead, err := chacha20poly1305.NewX(kek[:])
	if err != nil {
		panic(err)
	}
	return aead
}

// WrapKeys returns the key object that lets master key m open k.
func (m *MasterKey) WrapKeys(k *Keys) []byte {
	w := &Keys{objects: m.kek()}
	var ids string
	if k.ids.Keyed() {
		ids = SchemeKeyed
	}
	b, _ := json.Marshal(keyObject{Version: 1, Sealed: w.seal(nil, k.dataKey[:], keyAD(m.ID(), ids)), IDs: ids})
	return b
}

// UnwrapKeys opens the key object data with m. A key object m did not
// wrap is a wrong key (errdefs.ErrKey), a malformed one corruption.
func (m *MasterKey) UnwrapKeys(data []byte) (*Keys, error) {
	if len(data) > maxKeyFile {
		return nil, corrupt("key object: %d bytes, more than a key object holds", len(data))
	}
	var o keyObject
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return nil, corrupt("key object: %v", err)
	}
	if o.Version != 1 {
		return nil, corrupt("key object: version %d, want 1", o.Version)
	}
	if o.IDs != "" && o.IDs != SchemeKeyed {
		return nil, corrupt("key object: content ID scheme %q, want %q or none", o.IDs, SchemeKeyed)
	}
	w := &Keys{objects: m.kek()}
	dk, err := w.open(o.Sealed, keyAD(m.ID(), o.IDs))
	if err != nil || len(dk) != KeySize {
		return nil, keyError("key %s does not open the store's data key", m.ID())
	}
	return newKeys([KeySize]byte(dk), o.IDs == SchemeKeyed), nil
}
