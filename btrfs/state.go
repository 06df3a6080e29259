package btrfs

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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

// writeRecord writes a record in place: a torn one fails its checksum and
// costs a rebuild, so the rename writeFile does for the head is not needed.
func (m metaDir) writeRecord(r *record) error {
	p := m.recordPath(r.key())
	err := os.WriteFile(p, r.encode(), 0o600)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		err = os.WriteFile(p, r.encode(), 0o600)
	}
	return err
}

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
