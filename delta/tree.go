package delta

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
)

// Type is an entry's kind. The values are part of the tree encoding.
type Type uint8

const (
	TypeFile     Type = 1 // regular file; content is Chunks
	TypeDir      Type = 2 // directory; children are the tree Subtree
	TypeSymlink  Type = 3 // symbolic link to Target (never followed by turnsnap)
	TypeHardlink Type = 4 // another name for the regular file at root-relative path Target
	TypeWhiteout Type = 5 // overlay upper layer: the lower entry of this name is deleted
	TypeCharDev  Type = 6
	TypeBlockDev Type = 7
	TypeFIFO     Type = 8
	TypeSocket   Type = 9
)

var typeNames = map[Type]string{
	TypeFile: "file", TypeDir: "dir", TypeSymlink: "symlink", TypeHardlink: "hardlink",
	TypeWhiteout: "whiteout", TypeCharDev: "chardev", TypeBlockDev: "blockdev",
	TypeFIFO: "fifo", TypeSocket: "socket",
}

func (t Type) String() string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Xattr is one extended attribute. Overlay's own trusted.overlay.* attributes
// never appear here: the opaque marker is Entry.Opaque, the rest are the
// kernel's bookkeeping and are not state.
type Xattr = fsat.Xattr

// Entry is one name in a directory. Fields that do not apply to the entry's
// Type must be zero (the encoding rejects anything else), so that equal
// filesystem states always encode to equal bytes.
type Entry struct {
	Name    string
	Type    Type
	Mode    uint32 // permission bits only (07777)
	UID     uint32
	GID     uint32
	MtimeNs int64  // modification time, nanoseconds since the Unix epoch
	Size    uint64 // file: content length, the sum of its chunks' and holes' lengths
	Xattrs  []Xattr
	Target  string // symlink: link text; hardlink: root-relative path of the primary
	Rdev    uint64 // char/block devices
	Opaque  bool   // dir: overlay opaque directory (hides the lower dir's entries)
	Subtree ID     // dir: the tree of its children
	Chunks  []ID   // file: content chunks in order (nil for an indirect entry until ResolveChunks)
	// ChunkList names the chunk list blob holding Chunks (tree version 3):
	// set for files of more than IndirectChunks chunks by MakeIndirect, or
	// by DecodeTree; zero when the chunks are inline. NChunks is then how
	// many chunks the list holds.
	ChunkList ID
	NChunks   uint64
	Holes     []Hole // file: runs without data (sparse files), sorted; nil for most files
}

// FileContent is what reading a regular file yields: its size, its data
// chunks in order and its holes.
type FileContent struct {
	Size   uint64
	Chunks []ID
	Holes  []Hole
	// ChunkList and NChunks: content taken over from a recorded entry
	// whose chunk list was not loaded (Chunks nil); see Entry.
	ChunkList ID
	NChunks   uint64
}

// SetContent gives file entry e the content c.
func (e *Entry) SetContent(c FileContent) {
	e.Size, e.Chunks, e.Holes, e.ChunkList, e.NChunks = c.Size, c.Chunks, c.Holes, c.ChunkList, c.NChunks
}

// Content is e's content as a FileContent.
func (e *Entry) Content() FileContent {
	return FileContent{Size: e.Size, Chunks: e.Chunks, Holes: e.Holes, ChunkList: e.ChunkList, NChunks: e.NChunks}
}

// Tree is the listing of one directory, entries sorted by Name bytewise.
type Tree struct {
	Entries []Entry
}

// treeMagic starts every encoded tree; the last byte is the format version
// (treeVersionPlain, or treeVersionSparse for a tree with holes).
var treeMagic = []byte{'T', 'S', 'T', treeVersionPlain}

const flagOpaque = 1 << 0

const (
	// MaxEntryName is the longest entry name a tree holds, in bytes (the
	// kernel's NAME_MAX).
	MaxEntryName = 255
	// ModeMask is the part of a file's mode a tree records: permissions
	// and the setuid, setgid and sticky bits; the type is Entry.Type.
	ModeMask = 07777
)

// Find returns the entry named name, or nil.
func (t *Tree) Find(name string) *Entry {
	i, ok := slices.BinarySearchFunc(t.Entries, name, func(e Entry, n string) int { return strings.Compare(e.Name, n) })
	if !ok {
		return nil
	}
	return &t.Entries[i]
}

// Refs lists the blobs t references, once per reference: each directory's
// subtree and each file's chunks (a chunk a file names twice is listed
// twice). Refcounts count exactly these (docs/FORMAT.md), so every place
// that adds, recounts or releases references takes them from here.
func (t *Tree) Refs() []ID {
	var out []ID
	for _, e := range t.Entries {
		switch e.Type {
		case TypeDir:
			out = append(out, e.Subtree)
		case TypeFile:
			if e.Indirect() {
				out = append(out, e.ChunkList) // its chunks are the list's refs
			} else {
				out = append(out, e.Chunks...)
			}
		}
	}
	return out
}

// Sort puts entries (and each entry's xattrs) in canonical order.
func (t *Tree) Sort() {
	slices.SortFunc(t.Entries, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	for i := range t.Entries {
		slices.SortFunc(t.Entries[i].Xattrs, func(a, b Xattr) int { return strings.Compare(a.Name, b.Name) })
	}
}

// ValidName reports whether name may be a tree entry's name: a single path
// component that cannot climb out of its directory.
func ValidName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= MaxEntryName &&
		!strings.ContainsAny(name, "/\x00")
}

// ValidPath reports whether p is a clean root-relative path of valid names.
func ValidPath(p string) bool {
	if p == "" {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if !ValidName(c) {
			return false
		}
	}
	return true
}

// Check verifies the invariants of docs/FORMAT.md for one tree: names valid
// and strictly ascending, fields that do not apply to a type zero.
func (t *Tree) Check() error {
	for i := range t.Entries {
		e := &t.Entries[i]
		if !ValidName(e.Name) {
			return fmt.Errorf("entry %q: invalid name: %w", e.Name, errdefs.ErrInvalid)
		}
		if i > 0 && t.Entries[i-1].Name >= e.Name {
			return fmt.Errorf("entry %q: names not strictly ascending: %w", e.Name, errdefs.ErrInvalid)
		}
		if err := e.check(); err != nil {
			return fmt.Errorf("entry %q: %w", e.Name, err)
		}
	}
	return nil
}

func (e *Entry) check() error {
	bad := func(what string) error { return fmt.Errorf("%s %s: %w", e.Type, what, errdefs.ErrInvalid) }
	if e.Mode&^ModeMask != 0 {
		return bad("mode has non-permission bits")
	}
	for j := 1; j < len(e.Xattrs); j++ {
		if e.Xattrs[j-1].Name >= e.Xattrs[j].Name {
			return bad("xattrs not strictly ascending")
		}
	}
	for _, x := range e.Xattrs {
		if x.Name == "" {
			return bad("empty xattr name")
		}
	}
	if e.Type != TypeDir && (e.Opaque || !e.Subtree.IsZero()) {
		return bad("has directory fields")
	}
	if e.Type != TypeFile && (len(e.Chunks) != 0 || e.Size != 0 || len(e.Holes) != 0 || e.Indirect() || e.NChunks != 0) {
		return bad("has file content")
	}
	if e.Indirect() != (e.NChunks != 0) {
		return bad("chunk list and its count disagree")
	}
	if e.Indirect() && (e.NChunks <= IndirectChunks || e.NChunks > MaxFileChunks || (e.Chunks != nil && !e.Resolved())) {
		return bad(fmt.Sprintf("chunk list of %d chunks (%d loaded): a list holds %d to %d", e.NChunks, len(e.Chunks), IndirectChunks+1, uint64(MaxFileChunks)))
	}
	if e.Size > MaxFileSize {
		return bad(fmt.Sprintf("size %d is over the limit %d", e.Size, uint64(MaxFileSize)))
	}
	if err := checkHoles(e); err != nil {
		return errBadHoles(err)
	}
	if e.Type != TypeSymlink && e.Type != TypeHardlink && e.Target != "" {
		return bad("has a target")
	}
	if e.Type != TypeCharDev && e.Type != TypeBlockDev && e.Rdev != 0 {
		return bad("has a device number")
	}
	switch e.Type {
	case TypeFile, TypeSymlink, TypeFIFO, TypeSocket, TypeCharDev, TypeBlockDev:
	case TypeDir:
		if e.Subtree.IsZero() {
			return bad("has no subtree")
		}
	case TypeHardlink:
		if !ValidPath(e.Target) {
			return bad("target is not a clean relative path")
		}
		fallthrough
	case TypeWhiteout:
		// These carry no metadata of their own: a hardlink shares its
		// primary's inode, a whiteout only marks a deletion.
		if e.Mode != 0 || e.UID != 0 || e.GID != 0 || e.MtimeNs != 0 || len(e.Xattrs) != 0 {
			return bad("carries metadata")
		}
	default:
		return bad("unknown type")
	}
	return nil
}

// Encode returns the canonical encoding of t (docs/FORMAT.md, "Tree").
// t must already be sorted; Encode does not sort, so that a caller's bug shows
// up in Check instead of being hidden.
func (t *Tree) Encode() []byte {
	var b []byte
	v := t.treeVersion()
	b = append(b, treeMagic[:3]...)
	b = append(b, v)
	b = binary.AppendUvarint(b, uint64(len(t.Entries)))
	for i := range t.Entries {
		b = appendEntry(b, &t.Entries[i], v)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendEntry(b []byte, e *Entry, version byte) []byte {
	b = appendString(b, e.Name)
	b = append(b, byte(e.Type))
	b = binary.AppendUvarint(b, uint64(e.Mode))
	b = binary.AppendUvarint(b, uint64(e.UID))
	b = binary.AppendUvarint(b, uint64(e.GID))
	b = binary.AppendVarint(b, e.MtimeNs)
	var flags byte
	if e.Opaque {
		flags |= flagOpaque
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(e.Xattrs)))
	for _, x := range e.Xattrs {
		b = appendString(b, x.Name)
		b = binary.AppendUvarint(b, uint64(len(x.Value)))
		b = append(b, x.Value...)
	}
	switch e.Type {
	case TypeFile:
		b = binary.AppendUvarint(b, e.Size)
		b = binary.AppendUvarint(b, e.ChunkCount())
		if e.Indirect() {
			b = append(b, e.ChunkList[:]...)
		} else {
			for _, c := range e.Chunks {
				b = append(b, c[:]...)
			}
		}
		if version >= treeVersionSparse {
			b = appendHoles(b, e.Holes)
		}
	case TypeDir:
		b = append(b, e.Subtree[:]...)
	case TypeSymlink, TypeHardlink:
		b = appendString(b, e.Target)
	case TypeCharDev, TypeBlockDev:
		b = binary.AppendUvarint(b, e.Rdev)
	}
	return b
}
