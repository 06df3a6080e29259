package delta

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// DecodeTree parses an encoded tree and rejects anything that is not the
// canonical encoding of a valid tree, so one state has exactly one ID.
func DecodeTree(data []byte) (*Tree, error) {
	if len(data) > MaxTreeSize {
		return nil, fmt.Errorf("tree: %d bytes, more than the limit %d: %w", len(data), MaxTreeSize, errdefs.ErrCorrupt)
	}
	d := decoder{b: data}
	if len(data) < len(treeMagic) || !bytes.HasPrefix(data, treeMagic[:3]) {
		return nil, fmt.Errorf("tree: bad magic: %w", errdefs.ErrCorrupt)
	}
	version := data[3]
	if version != treeVersionPlain && version != treeVersionSparse && version != treeVersionIndirect {
		return nil, fmt.Errorf("tree: unsupported format version %d: %w", data[3], errdefs.ErrCorrupt)
	}
	d.b = d.b[len(treeMagic):]
	n := d.uvarint()
	if n > uint64(len(data)) || n > MaxTreeEntries { // every entry takes at least one byte
		return nil, fmt.Errorf("tree: entry count %d exceeds size or the limit %d: %w", n, MaxTreeEntries, errdefs.ErrCorrupt)
	}
	t := &Tree{Entries: make([]Entry, n)}
	for i := range t.Entries {
		e := &t.Entries[i]
		e.Name = d.str()
		e.Type = Type(d.byte())
		e.Mode = uint32(d.uvarint32())
		e.UID = uint32(d.uvarint32())
		e.GID = uint32(d.uvarint32())
		e.MtimeNs = d.varint()
		flags := d.byte()
		if flags&^flagOpaque != 0 {
			d.fail("unknown flags")
		}
		e.Opaque = flags&flagOpaque != 0
		if nx := d.uvarint(); nx > 0 && d.err == nil {
			if nx > uint64(len(d.b)) {
				d.fail("xattr count exceeds size")
			} else {
				e.Xattrs = make([]Xattr, nx)
				for j := range e.Xattrs {
					e.Xattrs[j].Name = d.str()
					e.Xattrs[j].Value = []byte(d.str())
				}
			}
		}
		switch e.Type {
		case TypeFile:
			e.Size = d.uvarint()
			nc := d.uvarint()
			if version == treeVersionIndirect && nc > IndirectChunks {
				// Version 3: a file of more chunks than an inline list may
				// hold names its chunk list; Check bounds the count.
				e.NChunks = nc
				e.ChunkList = d.id()
				if e.ChunkList.IsZero() {
					d.fail("zero chunk list id")
				}
			} else if nc > uint64(len(d.b))/32 {
				d.fail("chunk count exceeds size")
				break
			} else if nc > 0 {
				e.Chunks = make([]ID, nc)
				for j := range e.Chunks {
					e.Chunks[j] = d.id()
				}
			}
			if version >= treeVersionSparse {
				e.Holes = d.holes()
			}
		case TypeDir:
			e.Subtree = d.id()
		case TypeSymlink, TypeHardlink:
			e.Target = d.str()
		case TypeCharDev, TypeBlockDev:
			e.Rdev = d.uvarint()
		}
		if d.err != nil {
			break
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, fmt.Errorf("tree: %v: %w", d.err, errdefs.ErrCorrupt)
	}
	if err := t.Check(); err != nil {
		return nil, fmt.Errorf("tree: %v: %w", err, errdefs.ErrCorrupt)
	}
	// Varints admit several spellings of one number; only the shortest is
	// canonical. A version 2 tree without holes re-encodes as version 1, a
	// version 3 tree without a chunk list as version 1 or 2, and a version
	// 3 file of more than IndirectChunks chunks listed inline as a list.
	if !bytes.Equal(t.Encode(), data) {
		return nil, fmt.Errorf("tree: not canonically encoded: %w", errdefs.ErrCorrupt)
	}
	return t, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s", msg)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint32() uint64 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail("value exceeds 32 bits")
	}
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("truncated string")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) id() ID {
	var id ID
	if len(d.b) < len(id) {
		d.fail("truncated id")
		return id
	}
	copy(id[:], d.b)
	d.b = d.b[len(id):]
	return id
}
