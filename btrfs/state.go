package btrfs

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// A meta subvolume holds what the last committed scan of a live subvolume
// saw, so that the next scan reads only what changed after it:
//
//	meta/head          JSON: the state's tree, state key and generation
//	meta/links         JSON: multi-link inodes of the layer and their paths
//	meta/r/XX/INO-GEN  one record per directory of the layer
//
// It is snapshotted beside each restore point, so a rollback or branch gets
// the state that matches the restored subvolume in O(1). Everything in it is
// an accelerator: a missing or damaged meta costs one rebuild, which reads
// every file of the layer once, never a wrong tree.

const headVersion = 1

// head says which scanned state the records describe.
type head struct {
	Version int `json:"version"`
	// Basis is the UUID of the read-only snapshot whose contents the records
	// describe, and BasisParent the UUID of the subvolume it was taken of.
	// A live subvolume may use the records if it was snapshotted from the
	// basis (a restore) or the basis from it (a checkpoint).
	Basis       string `json:"basis"`
	BasisParent string `json:"basis_parent,omitempty"`
	// Gen is the transaction of the basis snapshot: inodes changed after it
	// are what the next scan has to look at.
	Gen  uint64   `json:"gen"`
	Root delta.ID `json:"root"`
	Key  delta.ID `json:"key"`
	// Pending lists directories whose trees may not be in the store yet (a
	// state advanced by a skip turn, or a foreign tree re-derived on
	// restore); every scan saves them again until a checkpoint commits.
	Pending []recKey `json:"pending,omitempty"`
}

func uuidString(u [16]byte) string { return hex.EncodeToString(u[:]) }

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

// metaDir is the path of a meta subvolume.
type metaDir string

func (m metaDir) headPath() string  { return filepath.Join(string(m), "head") }
func (m metaDir) linksPath() string { return filepath.Join(string(m), "links") }
func (m metaDir) recordPath(k recKey) string {
	return filepath.Join(string(m), "r", fmt.Sprintf("%02x", k.Ino&0xff),
		strconv.FormatUint(k.Ino, 10)+"-"+strconv.FormatUint(k.Gen, 10))
}

// readFile reads without updating atime: an atime update would dirty the
// filesystem and cost the next skip check a transaction commit.
func readFile(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOATIME|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// writeFile replaces p through a temp file and a rename, so a reader sees
// the old or the new content. Not synced: the meta is an accelerator, and
// what a crash loses is rebuilt.
func writeFile(p string, data []byte) error {
	dir := filepath.Dir(p)
	f, err := os.CreateTemp(dir, ".tmp-")
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		f, err = os.CreateTemp(dir, ".tmp-")
	}
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

func (m metaDir) readHead() (*head, error) {
	data, err := readFile(m.headPath())
	if err != nil {
		return nil, err
	}
	var h head
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("scan state %s: %v: %w", m.headPath(), err, errdefs.ErrCorrupt)
	}
	if h.Version != headVersion {
		return nil, fmt.Errorf("scan state %s: version %d: %w", m.headPath(), h.Version, errdefs.ErrCorrupt)
	}
	return &h, nil
}

func (m metaDir) writeHead(h *head) error {
	h.Version = headVersion
	data, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return writeFile(m.headPath(), data)
}

// readRecord returns the record of a directory inode, or nil if there is none.
func (m metaDir) readRecord(k recKey) (*record, error) {
	data, err := readFile(m.recordPath(k))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r, err := decodeRecord(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.recordPath(k), err)
	}
	if r.key() != k {
		return nil, fmt.Errorf("%s holds inode %d: %w", m.recordPath(k), r.Ino, errdefs.ErrCorrupt)
	}
	return r, nil
}

func (m metaDir) writeRecord(r *record) error { return writeFile(m.recordPath(r.key()), r.encode()) }

func (m metaDir) deleteRecord(k recKey) error {
	if err := os.Remove(m.recordPath(k)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// linkIndex maps each inode with several names in the layer to those names.
type linkIndex map[uint64][]string

func (m metaDir) readLinks() (linkIndex, error) {
	data, err := readFile(m.linksPath())
	if errors.Is(err, os.ErrNotExist) {
		return linkIndex{}, nil
	}
	if err != nil {
		return nil, err
	}
	var l linkIndex
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("%s: %v: %w", m.linksPath(), err, errdefs.ErrCorrupt)
	}
	return l, nil
}

func (m metaDir) writeLinks(l linkIndex) error {
	if len(l) == 0 {
		if err := os.Remove(m.linksPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return writeFile(m.linksPath(), data)
}
