package delta

import (
	"encoding/binary"
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Hole is a run of a sparse file that holds no data: it reads as zeros and
// takes no disk space (docs/FORMAT.md, "Sparse files"). A file's chunks are
// the bytes of its data runs, the parts of [0, Size) outside its holes, in
// order, as one stream: chunk boundaries do not follow the data runs.
type Hole struct {
	Off uint64
	Len uint64
}

// Limits of sparse files (docs/FORMAT.md, "Limits").
const (
	// MaxHoles bounds the holes one file entry records. A scan that finds
	// more records the rest as data (zeros, read and chunked).
	MaxHoles = 1 << 16
	// MaxFileSize bounds a file's declared size: ext4's own limit (16 TiB).
	// Without holes the chunk rule bounds it far lower.
	MaxFileSize = 1 << 44
)

// treeVersionPlain and treeVersionSparse are the tree versions: a tree is
// version 2 exactly when one of its file entries has holes, so every tree
// without sparse files keeps its version 1 bytes and ID.
const (
	treeVersionPlain  = 1
	treeVersionSparse = 2
)

// DataSize is how many bytes of e's content are data: its size less its
// holes, and the sum of its chunks' lengths.
func (e *Entry) DataSize() uint64 {
	n := e.Size
	for _, h := range e.Holes {
		n -= h.Len
	}
	return n
}

// checkHoles is tree invariant 9: holes have a length, are sorted, neither
// overlap nor touch (two touching holes are one), and lie inside the file.
// It is called only with e.Size <= MaxFileSize, so sums cannot overflow.
func checkHoles(e *Entry) error {
	if len(e.Holes) > MaxHoles {
		return fmt.Errorf("%d holes, more than the limit %d", len(e.Holes), MaxHoles)
	}
	var end uint64
	for i, h := range e.Holes {
		switch {
		case h.Len == 0:
			return fmt.Errorf("hole %d is empty", i)
		case i > 0 && h.Off <= end:
			return fmt.Errorf("hole %d at %d does not start after the previous one's end %d", i, h.Off, end)
		case h.Off > e.Size || h.Len > e.Size-h.Off:
			return fmt.Errorf("hole %d (%d+%d) ends beyond the file's size %d", i, h.Off, h.Len, e.Size)
		}
		end = h.Off + h.Len
	}
	return nil
}

// treeVersion is the version t encodes as.
func (t *Tree) treeVersion() byte {
	v := byte(treeVersionPlain)
	for i := range t.Entries {
		if t.Entries[i].Indirect() {
			return treeVersionIndirect
		}
		if len(t.Entries[i].Holes) > 0 {
			v = treeVersionSparse
		}
	}
	return v
}

// appendHoles encodes a file's holes in a version 2 tree: the count, then
// each hole as its distance from the previous hole's end and its length.
func appendHoles(b []byte, holes []Hole) []byte {
	b = binary.AppendUvarint(b, uint64(len(holes)))
	var end uint64
	for _, h := range holes {
		b = binary.AppendUvarint(b, h.Off-end)
		b = binary.AppendUvarint(b, h.Len)
		end = h.Off + h.Len
	}
	return b
}

// holes decodes appendHoles' bytes. Offsets are only summed here; the
// ranges are checked with the rest of the entry (checkHoles).
func (d *decoder) holes() []Hole {
	n := d.uvarint()
	if n == 0 || d.err != nil {
		return nil
	}
	if n > MaxHoles || n > uint64(len(d.b))/2 { // each hole takes at least two bytes
		d.fail("hole count exceeds size or the limit")
		return nil
	}
	out := make([]Hole, n)
	var end uint64
	for i := range out {
		gap, length := d.uvarint(), d.uvarint()
		if gap > MaxFileSize || length > MaxFileSize || end > MaxFileSize {
			d.fail("hole beyond the file size limit")
			return nil
		}
		out[i] = Hole{Off: end + gap, Len: length}
		end = out[i].Off + length
	}
	return out
}

// DataRuns returns the data runs of a file of size bytes with holes,
// as (offset, length) pairs in order.
func DataRuns(size uint64, holes []Hole) []Hole {
	var out []Hole
	var at uint64
	for _, h := range holes {
		if h.Off > at {
			out = append(out, Hole{Off: at, Len: h.Off - at})
		}
		at = h.Off + h.Len
	}
	if size > at {
		out = append(out, Hole{Off: at, Len: size - at})
	}
	return out
}

// errBadHoles wraps a hole rule's failure as corruption.
func errBadHoles(err error) error { return fmt.Errorf("file: %v: %w", err, errdefs.ErrInvalid) }
