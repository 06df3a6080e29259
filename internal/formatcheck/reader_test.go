package formatcheck

// A reader of docs/FORMAT.md written from the document alone: it imports
// none of turnsnap's packages (TestReaderImportsNoTurnsnapPackage checks),
// only BLAKE3, zstd and XChaCha20-Poly1305, and every rule below cites the
// section it comes from. It reports each damage it meets as an error naming
// the object, and reads on, as `turnsnap verify --store-only` does.

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"
	"golang.org/x/crypto/chacha20poly1305"
)

// Expect is what a path looked like in the mounted sandbox when the fixture
// was made (gen_test.go).
type Expect struct {
	Type    string            `json:"type"`
	Mode    uint32            `json:"mode,omitempty"`
	Content string            `json:"blake3,omitempty"` // of the file's content
	Size    int64             `json:"size,omitempty"`
	Target  string            `json:"target,omitempty"`
	Rdev    uint64            `json:"rdev,omitempty"`
	MtimeNs int64             `json:"mtime_ns,omitempty"`
	Xattrs  map[string]string `json:"xattrs,omitempty"`
}

// Manifest is what the writer wrote into a fixture bucket, recorded by the
// generator beside it (testdata/NAME.json).
type Manifest struct {
	Checkpoints map[string]CheckpointManifest `json:"checkpoints"`
	Refs        map[string]RefManifest        `json:"refs"`            // object name -> what it names
	Marks       map[string][]string           `json:"marks,omitempty"` // mark object -> record IDs
	KeyFile     string                        `json:"key_file,omitempty"`
}

// CheckpointManifest is one record as its writer made it, and the files
// its sandbox showed.
type CheckpointManifest struct {
	Version    int               `json:"version"`
	Class      string            `json:"class"`
	SandboxID  string            `json:"sandbox_id,omitempty"`
	Conv       string            `json:"conv,omitempty"`
	ProcChange string            `json:"proc_change,omitempty"`
	Files      map[string]Expect `json:"files"`
	// Journal is what the record's journal holds, by file name.
	Journal map[string]JournalExpect `json:"journal,omitempty"`
	// ProcImage says the record names a process image.
	ProcImage bool `json:"proc_image,omitempty"`
}

// JournalExpect is one model exchange: BLAKE3 of its request and response.
type JournalExpect struct {
	Request  string `json:"request"`
	Response string `json:"response"`
}

// RefManifest is a ref's target and, for a pushed head, its owner line.
type RefManifest struct {
	Target string `json:"target"`
	Owner  string `json:"owner,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
}

// Damage names the objects testdata/damaged breaks (gen_test.go).
type Damage struct {
	Flipped   string `json:"flipped"`   // a pack with one byte changed
	Truncated string `json:"truncated"` // a record cut short
	Missing   string `json:"missing"`   // a record a head names, deleted
}

type id [32]byte

func (x id) String() string { return hex.EncodeToString(x[:]) }

func parseHex(s string) (id, error) {
	var x id
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 || s != strings.ToLower(s) {
		return x, fmt.Errorf("%q is not 64 lowercase hex digits", s)
	}
	copy(x[:], b)
	return x, nil
}

// "Pack": one header entry.
type loc struct {
	pack             string
	typ              byte
	off, length, raw uint64
	comp             byte
}

// "Tree": one decoded entry.
type entry struct {
	name           string
	typ            byte
	mode, uid, gid uint64
	mtime          int64
	opaque         bool
	xattrs         [][2]string
	size           uint64
	chunks         []id
	holes          [][2]uint64 // (gap, length) as encoded ("Sparse files")
	list           id          // "Indirect chunk lists": the chunk list named, or zero
	subtree        id
	target         string
	rdev           uint64
}

const (
	tFile, tDir, tSymlink, tHardlink, tWhiteout = 1, 2, 3, 4, 5
	tChardev, tBlockdev, tFifo, tSocket         = 6, 7, 8, 9
	maxData, maxTree                            = 262144, 33554432 // "Limits"
	maxInline, maxListChunks                    = 16, 1048575      // "Indirect chunk lists"
	maxRecord, maxSmall, maxMarks               = 1 << 20, 64 << 10, 32 << 20
	maxHoles                                    = 65536
	sealOverhead                                = 24 + 16 // "Encrypted stores": nonce and tag
)

var typeNames = map[byte]string{tFile: "file", tDir: "dir", tSymlink: "symlink", tHardlink: "hardlink",
	tWhiteout: "whiteout", tChardev: "chardev", tBlockdev: "blockdev", tFifo: "fifo", tSocket: "socket"}

// damage is one thing wrong with the store, raised by fail and collected by
// try: the reader goes on with the next object, as a verifier does.
type damage struct{ err error }

type reader struct {
	objects map[string][]byte
	index   map[id][]loc
	trees   map[id][]entry
	dec     *zstd.Decoder
	seen    map[string]int // what the fixture exercised, for the coverage check
	errs    []error

	// "Encrypted stores": nil for a plaintext store.
	seal interface {
		Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error)
	}
	idKey *[32]byte // "Content IDs": keyed BLAKE3, nil for plain
}

func (r *reader) fail(format string, a ...any) {
	panic(damage{fmt.Errorf(format, a...)})
}

// try runs one unit of reading and collects the damage it meets.
func (r *reader) try(f func()) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			d, isDamage := v.(damage)
			if !isDamage {
				panic(v)
			}
			r.errs = append(r.errs, d.err)
			ok = false
		}
	}()
	f()
	return true
}

// contentID is "Content IDs": the store's scheme.
func (r *reader) contentID(b []byte) id {
	if r.idKey == nil {
		return blake3.Sum256(b)
	}
	h, _ := blake3.NewKeyed(r.idKey[:])
	var x id
	h.Write(b)
	copy(x[:], h.Sum(nil))
	return x
}

// openStore reads every object of a store directory. keyFile, for an
// encrypted store, is the master key file.
func openStore(t *testing.T, dir, keyFile string) *reader {
	r := &reader{objects: map[string][]byte{}, index: map[id][]loc{}, trees: map[id][]entry{}, seen: map[string]int{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		r.objects[filepath.ToSlash(strings.TrimPrefix(p, dir+"/"))] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.dec, err = zstd.NewReader(nil, zstd.WithDecodeAllCapLimit(true)); err != nil {
		t.Fatal(err)
	}
	if keyFile != "" {
		r.try(func() { r.unwrapKey(keyFile) })
	}
	// "Finding a blob without the catalog": every pack header.
	packName := regexp.MustCompile(`^packs/([0-9a-f]{2})/([0-9a-f]{64})$`)
	var names []string
	for name := range r.objects {
		names = append(names, name)
	}
	sort.Strings(names) // a stable order, so a blob's first good copy is the same each run
	for _, name := range names {
		if !strings.HasPrefix(name, "packs/") {
			continue
		}
		r.try(func() {
			data := r.objects[name]
			m := packName.FindStringSubmatch(name)
			if m == nil || m[2][:2] != m[1] {
				r.fail("object %s: not a pack name", name)
			}
			found := r.readHeader(name, data)
			if got := r.contentID(data); got.String() != m[2] && r.plainLayoutID(data, found).String() != m[2] {
				r.fail("pack %s: content hashes to %s, not to its name", name, got)
			}
			for _, f := range found {
				r.index[f.x] = append(r.index[f.x], f.l)
			}
		})
	}
	return r
}

// unwrapKey is "Encrypted stores": the key file gives the master key, the
// master key opens keys/<id>, the data key derives the sealing key and the
// content ID key.
func (r *reader) unwrapKey(keyFile string) {
	data, err := os.ReadFile(keyFile)
	if err != nil {
		r.fail("key file: %v", err)
	}
	var kf struct {
		Version int    `json:"version"`
		Kind    string `json:"kind"`
		Key     string `json:"key"`
	}
	strictJSON(r, keyFile, data, &kf)
	master, err := base64.StdEncoding.DecodeString(kf.Key)
	if err != nil || len(master) != 32 || kf.Version != 1 || kf.Kind != "turnsnap-master-key" {
		r.fail("key file %s: not a version 1 turnsnap master key", keyFile)
	}
	derive := func(ctx string, key []byte) []byte {
		out := make([]byte, 32)
		blake3.DeriveKey(ctx, key, out)
		return out
	}
	keyID := hex.EncodeToString(derive("turnsnap 2026-12 master key id v1", master)[:16])
	name := "keys/" + keyID
	obj, ok := r.objects[name]
	if !ok {
		r.fail("object %s: no key object for the key file's master key", name)
	}
	var ko struct {
		Version int    `json:"version"`
		Sealed  string `json:"sealed"`
		IDs     string `json:"ids,omitempty"`
	}
	strictJSON(r, name, obj, &ko)
	sealed, err := base64.StdEncoding.DecodeString(ko.Sealed)
	if err != nil || ko.Version != 1 || (ko.IDs != "" && ko.IDs != "blake3-keyed") || len(sealed) < sealOverhead {
		r.fail("object %s: version %d, ids %q: not a key object", name, ko.Version, ko.IDs)
	}
	ad := "turnsnap/data-key/v1" + keyID
	if ko.IDs != "" {
		ad += "/ids=" + ko.IDs
	}
	kek, _ := chacha20poly1305.NewX(derive("turnsnap 2026-12 master key wrapping v1", master))
	dataKey, err := kek.Open(nil, sealed[:24], sealed[24:], []byte(ad))
	if err != nil || len(dataKey) != 32 {
		r.fail("object %s: the master key does not open the data key", name)
	}
	r.seal, _ = chacha20poly1305.NewX(derive("turnsnap 2026-12 object sealing v1", dataKey))
	if ko.IDs != "" {
		r.idKey = (*[32]byte)(derive("turnsnap 2026-12 content ids v1", dataKey))
		r.seen["keyed content IDs"]++
	}
	r.seen["encrypted store"]++
}

// object returns an object's plaintext: as stored in a plaintext store, or
// opened from its "TSX1" form in an encrypted one.
func (r *reader) object(name string) []byte {
	data, ok := r.objects[name]
	if !ok {
		r.fail("object %s: missing", name)
	}
	if r.seal == nil {
		if bytes.HasPrefix(data, []byte("TSX1")) {
			r.fail("object %s: sealed, and the store has no key", name)
		}
		return data
	}
	rest, ok := bytes.CutPrefix(data, []byte("TSX1"))
	if !ok || len(rest) < sealOverhead {
		r.fail("object %s: not sealed in an encrypted store", name)
	}
	plain, err := r.seal.Open(nil, rest[:24], rest[24:], []byte("TSX1"+name))
	if err != nil {
		r.fail("object %s: sealed bytes do not open: %v", name, err)
	}
	r.seen["sealed object"]++
	return plain
}

func (r *reader) uvarint(what string, b []byte) (uint64, []byte) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		r.fail("%s: bad uvarint", what)
	}
	return v, b[n:]
}

// take returns the first n bytes of b, or fails naming what was cut short.
func (r *reader) take(what string, b []byte, n uint64) ([]byte, []byte) {
	if uint64(len(b)) < n {
		r.fail("%s: truncated", what)
	}
	return b[:n], b[n:]
}

// packEntry is one blob a pack header lists.
type packEntry struct {
	x id
	l loc
}

// plainLayoutID is "Plaintext local store": the ID of a sealed pack's
// plaintext layout (every blob opened, contiguous in the same order, the
// plaintext header and a "TSP1" footer), which names a pack a home with a
// plaintext local store uploaded. Zero for a plaintext store.
func (r *reader) plainLayoutID(data []byte, found []packEntry) id {
	if r.seal == nil {
		return id{}
	}
	var blobs, header []byte
	header = binary.AppendUvarint(header, uint64(len(found)))
	for _, f := range found {
		ad := append([]byte("turnsnap/blob/v1"), f.l.typ)
		ad = append(ad, f.x[:]...)
		sealed := data[f.l.off : f.l.off+f.l.length]
		stored, err := r.seal.Open(nil, sealed[:24], sealed[24:], ad)
		if err != nil {
			r.fail("pack %s: blob %s: sealed bytes do not open: %v", f.l.pack, f.x, err)
		}
		header = append(header, f.l.typ)
		header = append(header, f.x[:]...)
		header = binary.AppendUvarint(header, uint64(len(blobs)))
		header = binary.AppendUvarint(header, uint64(len(stored)))
		header = binary.AppendUvarint(header, f.l.raw)
		header = append(header, f.l.comp)
		blobs = append(blobs, stored...)
	}
	plain := append(append(blobs, header...), binary.LittleEndian.AppendUint32(nil, uint32(len(header)))...)
	r.seen["pack named by its plaintext layout"]++
	return r.contentID(append(plain, "TSP1"...))
}

func (r *reader) readHeader(name string, data []byte) []packEntry {
	what := "pack " + name
	magic := "TSP1"
	if r.seal != nil {
		magic = "TSE1" // "Encrypted stores": SealedPack
	}
	if len(data) < 8 || string(data[len(data)-4:]) != magic {
		r.fail("%s: no %q footer", what, magic)
	}
	hlen := uint64(binary.LittleEndian.Uint32(data[len(data)-8:]))
	if hlen > uint64(len(data))-8 {
		r.fail("%s: header length %d does not fit", what, hlen)
	}
	start := uint64(len(data)) - 8 - hlen
	h := data[start : len(data)-8]
	if r.seal != nil {
		if len(h) < sealOverhead {
			r.fail("%s: sealed header too short", what)
		}
		var err error
		if h, err = r.seal.Open(nil, h[:24], h[24:], []byte("turnsnap/pack-header/v1")); err != nil {
			r.fail("%s: sealed header does not open: %v", what, err)
		}
		r.seen["sealed pack"]++
	}
	n, h := r.uvarint(what, h)
	if n == 0 {
		r.seen["empty pack"]++
	}
	var next uint64
	local := map[id]bool{}
	var found []packEntry
	for range n {
		var l loc
		var x id
		var head []byte
		head, h = r.take(what, h, 33)
		l.pack, l.typ = name, head[0]
		copy(x[:], head[1:])
		l.off, h = r.uvarint(what, h)
		l.length, h = r.uvarint(what, h)
		l.raw, h = r.uvarint(what, h)
		var c []byte
		c, h = r.take(what, h, 1)
		l.comp = c[0]
		stored := l.length
		if r.seal != nil {
			stored -= sealOverhead // "Encrypted stores": length counts nonce and tag
		}
		switch {
		case l.off != next:
			r.fail("%s: blob %s not where the previous ends", what, x)
		case l.typ != 1 && l.typ != 2, l.comp > 1:
			r.fail("%s: blob %s: unknown type %d or compression %d", what, x, l.typ, l.comp)
		case l.typ == 1 && l.raw > maxData, l.typ == 2 && l.raw > maxTree:
			r.fail("%s: blob %s: raw_length %d over the limit", what, x, l.raw)
		case r.seal != nil && l.length < sealOverhead:
			r.fail("%s: blob %s: shorter than the seal", what, x)
		case l.comp == 0 && l.raw != stored:
			r.fail("%s: blob %s: uncompressed with raw_length %d != stored length %d", what, x, l.raw, stored)
		case local[x]:
			r.fail("%s: blob %s twice", what, x)
		}
		local[x] = true
		next = l.off + l.length
		found = append(found, packEntry{x, l})
	}
	if len(h) != 0 || next != start {
		r.fail("%s: header does not end the blobs exactly", what)
	}
	return found
}

// blob is "Blob storage": any copy of the blob that checks out, opened,
// decompressed within its limit, and hashed.
func (r *reader) blob(x id, typ byte) []byte {
	var last error
	for _, l := range r.index[x] {
		var out []byte
		if r.try(func() { out = r.blobAt(x, typ, l) }) {
			return out
		}
		last = r.errs[len(r.errs)-1]
		r.errs = r.errs[:len(r.errs)-1]
	}
	if last != nil {
		panic(damage{last})
	}
	r.fail("blob %s (%s) in no pack", x, map[byte]string{1: "data", 2: "tree"}[typ])
	return nil
}

func (r *reader) blobAt(x id, typ byte, l loc) []byte {
	what := fmt.Sprintf("blob %s in pack %s", x, l.pack)
	if l.typ != typ {
		// "Content IDs": the same bytes as the other type serve, within
		// this type's limit.
		if most := map[byte]uint64{1: maxData, 2: maxTree}[typ]; l.raw > most {
			r.fail("%s: stored as type %d, %d bytes, over type %d's limit", what, l.typ, l.raw, typ)
		}
		r.seen["blob stored as the other type"]++
	}
	b := r.objects[l.pack][l.off : l.off+l.length]
	if r.seal != nil {
		ad := append([]byte("turnsnap/blob/v1"), l.typ)
		ad = append(ad, x[:]...)
		var err error
		if b, err = r.seal.Open(nil, b[:24], b[24:], ad); err != nil {
			r.fail("%s: sealed bytes do not open: %v", what, err)
		}
	}
	if l.comp == 1 {
		r.seen["zstd blob"]++
		out, err := r.dec.DecodeAll(b, make([]byte, 0, l.raw+1))
		if err != nil || uint64(len(out)) != l.raw {
			r.fail("%s: zstd frame is not %d bytes: %v", what, l.raw, err)
		}
		b = out
	}
	if r.contentID(b) != x {
		r.fail("%s: plaintext does not hash to its ID", what)
	}
	return b
}

func (r *reader) str(what string, b []byte) (string, []byte) {
	n, b := r.uvarint(what, b)
	s, b := r.take(what, b, n)
	return string(s), b
}

func (r *reader) tree(x id) []entry {
	if es, ok := r.trees[x]; ok {
		return es
	}
	what := "tree " + x.String()
	data := r.blob(x, 2)
	if len(data) < 4 || !bytes.HasPrefix(data, []byte("TST")) || data[3] < 1 || data[3] > 3 {
		r.fail("%s: bad magic or unknown version", what)
	}
	version := data[3]
	r.seen[fmt.Sprintf("tree version %d", version)]++
	n, b := r.uvarint(what, data[4:])
	if n > uint64(len(b))/10 {
		r.fail("%s: %d entries cannot fit", what, n)
	}
	es := make([]entry, n)
	for i := range es {
		e := &es[i]
		e.name, b = r.str(what, b)
		what := what + ": entry " + strconv.Quote(e.name)
		var t []byte
		t, b = r.take(what, b, 1)
		e.typ = t[0]
		e.mode, b = r.uvarint(what, b)
		e.uid, b = r.uvarint(what, b)
		e.gid, b = r.uvarint(what, b)
		var k int
		e.mtime, k = binary.Varint(b)
		if k <= 0 {
			r.fail("%s: bad varint", what)
		}
		b = b[k:]
		var fl []byte
		fl, b = r.take(what, b, 1)
		flags := fl[0]
		e.opaque = flags&1 != 0
		var nx uint64
		nx, b = r.uvarint(what, b)
		for range nx {
			var xn, xv string
			xn, b = r.str(what, b)
			xv, b = r.str(what, b)
			e.xattrs = append(e.xattrs, [2]string{xn, xv})
		}
		var raw []byte
		switch e.typ {
		case tFile:
			var nc uint64
			e.size, b = r.uvarint(what, b)
			nc, b = r.uvarint(what, b)
			if version == 3 && nc > maxInline {
				// "Indirect chunk lists": one ID, the count bounded first.
				if nc > maxListChunks {
					r.fail("%s: %d chunks, over the list limit", what, nc)
				}
				raw, b = r.take(what, b, 32)
				copy(e.list[:], raw)
			} else {
				if nc > uint64(len(b))/32 {
					r.fail("%s: %d chunks exceed the tree", what, nc)
				}
				for range nc {
					var c id
					raw, b = r.take(what, b, 32)
					copy(c[:], raw)
					e.chunks = append(e.chunks, c)
				}
			}
			if version >= 2 {
				var nh uint64
				nh, b = r.uvarint(what, b)
				if nh > maxHoles {
					r.fail("%s: %d holes", what, nh)
				}
				var end uint64
				for j := range nh {
					var h [2]uint64
					h[0], b = r.uvarint(what, b)
					h[1], b = r.uvarint(what, b)
					// "Tree" rule 9: holes of length >= 1, apart, inside the size.
					if h[1] == 0 || (j > 0 && h[0] == 0) || end+h[0]+h[1] > e.size || end+h[0]+h[1] < end {
						r.fail("%s: hole %d breaks rule 9", what, j)
					}
					end += h[0] + h[1]
					e.holes = append(e.holes, h)
				}
				if nh > 0 {
					r.seen["sparse file"]++
				}
			}
			// "Chunks": an empty file has no chunks; nc <= data <= nc*256KiB,
			// data being the size less the holes.
			data := e.size
			for _, h := range e.holes {
				data -= h[1]
			}
			if nc > data || data > nc*maxData {
				r.fail("%s: %d data bytes in %d chunks", what, data, nc)
			}
			if e.list != (id{}) {
				e.chunks = r.chunkList(e.list, nc)
			}
			if len(e.chunks) == 0 {
				r.seen["empty file"]++
			} else if len(e.chunks) > 1 {
				r.seen["file of several chunks"]++
			}
		case tDir:
			raw, b = r.take(what, b, 32)
			copy(e.subtree[:], raw)
		case tSymlink, tHardlink:
			e.target, b = r.str(what, b)
		case tChardev, tBlockdev:
			e.rdev, b = r.uvarint(what, b)
		case tWhiteout, tFifo, tSocket:
		default:
			r.fail("%s: unknown type %d", what, e.typ)
		}
		r.seen[typeNames[e.typ]]++
		// Rules 2 to 5 and "Numeric ranges".
		for j, xa := range e.xattrs {
			if xa[0] == "" || len(xa[0]) > 255 || len(xa[1]) > 65536 || (j > 0 && e.xattrs[j-1][0] >= xa[0]) {
				r.fail("%s: xattr %q breaks rule 2 or a limit", what, xa[0])
			}
		}
		if (e.typ == tHardlink || e.typ == tWhiteout) && (e.mode != 0 || e.uid != 0 || e.gid != 0 || e.mtime != 0 || len(e.xattrs) != 0) {
			r.fail("%s: a hardlink or whiteout with metadata (rule 5)", what)
		}
		if (e.typ == tSymlink || e.typ == tHardlink) && (e.target == "" || len(e.target) > 4095 || strings.Contains(e.target, "\x00")) {
			r.fail("%s: target of %d bytes", what, len(e.target))
		}
		if e.typ == tHardlink && (strings.HasPrefix(e.target, "/") || slicesContains(strings.Split(e.target, "/"), "") ||
			slicesContains(strings.Split(e.target, "/"), ".") || slicesContains(strings.Split(e.target, "/"), "..")) {
			r.fail("%s: hardlink target %q is not a clean relative path", what, e.target)
		}
		if len(e.name) > 255 || e.uid >= 1<<32 || e.gid >= 1<<32 || e.size > 1<<44 {
			r.fail("%s: over a numeric limit", what)
		}
		if i > 0 && es[i-1].name >= e.name || flags&^1 != 0 || e.mode&^07777 != 0 || e.name == "" ||
			strings.ContainsAny(e.name, "/\x00") || e.name == "." || e.name == ".." || (e.opaque && e.typ != tDir) {
			r.fail("%s: breaks a tree invariant", what)
		}
	}
	if len(b) != 0 {
		r.fail("%s: trailing bytes", what)
	}
	if !bytes.Equal(encode(es), data) { // rule 7
		r.fail("%s: not canonically encoded", what)
	}
	r.trees[x] = es
	return es
}

// chunkList is "Indirect chunk lists": a tree blob with its own magic,
// canonical, of exactly the entry's nc chunks.
func (r *reader) chunkList(x id, nc uint64) []id {
	what := "chunk list " + x.String()
	data := r.blob(x, 2)
	if !bytes.HasPrefix(data, []byte("TSL\x01")) {
		r.fail("%s: bad magic or version", what)
	}
	n, b := r.uvarint(what, data[4:])
	if n != nc || n <= maxInline || n > maxListChunks || uint64(len(b)) != 32*n ||
		len(data)-4-len(b) != len(binary.AppendUvarint(nil, n)) {
		r.fail("%s: %d chunks in %d bytes, its entry says %d", what, n, len(b), nc)
	}
	r.seen["chunk list"]++
	out := make([]id, n)
	for i := range out {
		copy(out[i][:], b[32*i:])
	}
	return out
}

// encode is "Tree" written out, for rule 7 and for state keys: version 3
// when a file names a chunk list, else 2 when one has holes, else 1.
func encode(es []entry) []byte {
	version := byte(1)
	for _, e := range es {
		if e.list != (id{}) {
			version = 3
			break
		}
		if len(e.holes) > 0 {
			version = 2
		}
	}
	b := append([]byte{'T', 'S', 'T', version}, binary.AppendUvarint(nil, uint64(len(es)))...)
	s := func(v string) { b = append(binary.AppendUvarint(b, uint64(len(v))), v...) }
	for _, e := range es {
		s(e.name)
		b = append(b, e.typ)
		b = binary.AppendUvarint(b, e.mode)
		b = binary.AppendUvarint(b, e.uid)
		b = binary.AppendUvarint(b, e.gid)
		b = binary.AppendVarint(b, e.mtime)
		var f byte
		if e.opaque {
			f = 1
		}
		b = append(b, f)
		b = binary.AppendUvarint(b, uint64(len(e.xattrs)))
		for _, x := range e.xattrs {
			s(x[0])
			s(x[1])
		}
		switch e.typ {
		case tFile:
			b = binary.AppendUvarint(b, e.size)
			b = binary.AppendUvarint(b, uint64(len(e.chunks)))
			if e.list != (id{}) {
				b = append(b, e.list[:]...)
			} else {
				for _, c := range e.chunks {
					b = append(b, c[:]...)
				}
			}
			if version >= 2 {
				b = binary.AppendUvarint(b, uint64(len(e.holes)))
				for _, h := range e.holes {
					b = binary.AppendUvarint(b, h[0])
					b = binary.AppendUvarint(b, h[1])
				}
			}
		case tDir:
			b = append(b, e.subtree[:]...)
		case tSymlink, tHardlink:
			s(e.target)
		case tChardev, tBlockdev:
			b = binary.AppendUvarint(b, e.rdev)
		}
	}
	return b
}

// stateKey is "State key": base is the base directory at the same path
// (nil if there is none).
func (r *reader) stateKey(x id, base []entry) id {
	var out []entry
	for _, e := range r.tree(x) {
		if e.typ == tDir {
			var sub []entry
			var bd *entry
			for i := range base {
				if base[i].name == e.name && base[i].typ == tDir {
					bd = &base[i]
					sub = r.tree(bd.subtree)
				}
			}
			e.mtime, e.subtree = 0, r.stateKey(e.subtree, sub)
			empty := r.contentID([]byte("TST\x01\x00"))
			if !e.opaque && e.subtree == empty && bd != nil && bd.mode == e.mode && bd.uid == e.uid &&
				bd.gid == e.gid && fmt.Sprint(bd.xattrs) == fmt.Sprint(e.xattrs) {
				r.seen["residue dir"]++
				continue // residue
			}
		}
		out = append(out, e)
	}
	return r.contentID(encode(out))
}

// merge is "Writable layers and layer stacks": the state a process sees,
// by root-relative path.
func (r *reader) merge(baseTree, layer id) map[string]entry {
	out := map[string]entry{}
	var files map[string]bool // file entries met so far in this tree, in canonical order
	var walk func(x id, at string, fromLayer bool)
	walk = func(x id, at string, fromLayer bool) {
		for _, e := range r.tree(x) {
			p := strings.TrimPrefix(at+"/"+e.name, "/")
			// "Hardlink targets": a file of the same tree, earlier in
			// canonical order (rules 5 and 6).
			if e.typ == tFile {
				files[p] = true
			}
			if e.typ == tHardlink && !files[e.target] {
				r.fail("tree %s: %s: hardlink to %q, no earlier file of the same tree", x, p, e.target)
			}
			if !fromLayer && (e.typ == tWhiteout || e.opaque) {
				r.fail("tree %s: %s: a whiteout or opaque directory in a plain state", x, p)
			}
			if fromLayer {
				if old, ok := out[p]; ok && !(e.typ == tDir && !e.opaque && old.typ == tDir) {
					for q := range out { // the name is replaced: drop what was below it
						if strings.HasPrefix(q, p+"/") {
							delete(out, q)
						}
					}
				}
				if e.typ == tWhiteout {
					r.seen["whiteout"]++
					delete(out, p)
					continue
				}
				if e.opaque {
					r.seen["opaque dir"]++
				}
				if e.typ == tHardlink {
					r.seen["hardlink in a layer"]++
				}
			}
			out[p] = e
			if e.typ == tDir {
				walk(e.subtree, p, fromLayer)
			}
		}
	}
	files = map[string]bool{}
	walk(baseTree, "", false)
	files = map[string]bool{}
	walk(layer, "", true)
	return out
}

// record is "Record": every field, nothing else.
type record struct {
	Version    int              `json:"version"`
	Sandbox    string           `json:"sandbox"`
	SandboxID  string           `json:"sandbox_id,omitempty"` // "Sandbox identity", record version 2
	Parent     string           `json:"parent"`
	Turn       int64            `json:"turn"`
	Class      string           `json:"class"`
	Backend    string           `json:"backend"`
	BaseTree   string           `json:"base_tree"`
	FSTree     string           `json:"fs_tree"`
	StateKey   string           `json:"state_key"`
	ProcTree   string           `json:"proc_tree,omitempty"`
	Host       json.RawMessage  `json:"host,omitempty"`
	Conv       string           `json:"conv,omitempty"`        // record version 3
	Journal    string           `json:"journal,omitempty"`     // record version 3
	ProcChange string           `json:"proc_change,omitempty"` // record version 4
	Message    string           `json:"message,omitempty"`
	Created    string           `json:"created"`
	RawStats   map[string]int64 `json:"stats"`
}

func strictJSON(r *reader, name string, data []byte, v any) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		r.fail("object %s: %v", name, err)
	}
	if d.More() {
		r.fail("object %s: trailing data", name)
	}
}

func (r *reader) checkTime(what, s string) time.Time {
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !strings.HasSuffix(s, "Z") || tm.Format(time.RFC3339Nano) != s {
		r.fail("%s: time %q is not RFC 3339 UTC with trimmed nanoseconds", what, s)
	}
	return tm
}

var (
	hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)
	hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
	label = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)
)

// readRecord is "Record", the fields' rules and "Versioning".
func (r *reader) readRecord(name string) record {
	data := r.object(name)
	hexID := strings.TrimPrefix(name, "records/")
	if len(data) > maxRecord {
		r.fail("record %s: %d bytes, over the limit", name, len(data))
	}
	// Record IDs are always plain BLAKE3 ("Content IDs").
	if x := blake3.Sum256(data); hex.EncodeToString(x[:]) != hexID {
		r.fail("record %s: its bytes hash to %s", name, hex.EncodeToString(x[:]))
	}
	var rec record
	strictJSON(r, name, data, &rec)
	stats := []string{"entries", "files_read", "bytes_read", "blobs_new", "bytes_new", "objects_new", "duration_ns", "pause_ns"}
	for k, v := range rec.RawStats {
		if !strings.Contains(" "+strings.Join(stats, " ")+" ", " "+k+" ") || v < 0 {
			r.fail("record %s: stats field %q is not in the document", name, k)
		}
	}
	r.checkTime("record "+name, rec.Created)
	v := rec.Version
	bad := func(why string) { r.fail("record %s: version %d: %s", name, v, why) }
	switch {
	case v < 1 || v > 4:
		bad("unknown version")
	case v == 1 && rec.SandboxID != "":
		bad("a version 1 record has no sandbox_id")
	case rec.SandboxID != "" && !hex32.MatchString(rec.SandboxID):
		bad("sandbox_id is not 32 hex digits")
	case v < 3 && (rec.Conv != "" || rec.Journal != ""):
		bad("conv or journal below version 3")
	case v == 3 && rec.Conv == "" && rec.Journal == "":
		bad("version 3 without conv or journal")
	case v < 4 && rec.ProcChange != "":
		bad("proc_change below version 4")
	case v == 4 && rec.ProcChange == "":
		bad("version 4 without proc_change")
	case len(rec.ProcChange) > 1024:
		bad("proc_change over 1,024 bytes")
	case rec.Class != "fs" && rec.Class != "process" && rec.Class != "full" && rec.Class != "skip":
		bad("class " + rec.Class)
	case rec.Backend != "overlay" && rec.Backend != "btrfs":
		bad("backend " + rec.Backend)
	case !label.MatchString(rec.Sandbox):
		bad("sandbox name " + rec.Sandbox)
	case rec.Turn < 0, rec.Parent == "" && rec.Turn != 0:
		bad("turn: a record without a parent is a turn 0")
	}
	for _, h := range []string{rec.BaseTree, rec.FSTree, rec.StateKey} {
		if !hex64.MatchString(h) {
			bad("a tree ID is not 64 hex digits")
		}
	}
	for _, h := range []string{rec.Parent, rec.ProcTree, rec.Conv, rec.Journal} {
		if h != "" && !hex64.MatchString(h) {
			bad("an optional ID is not 64 hex digits")
		}
	}
	r.seen[fmt.Sprintf("record version %d", v)]++
	r.seen["class "+rec.Class]++
	return rec
}

// TestFixtureStoresReadFromTheDocument reads every fixture: "store",
// written before sandbox ids and chunk lists (record and tree version 1),
// and "store-v3", written with the first chunk lists (local stores, both
// from older writers, which every later reader must still read); "bucket"
// and "sealed", buckets today's writer pushed (gen_test.go), the second
// from an encrypted home with keyed content IDs, and "sealed-plainlocal",
// the bucket of an encrypted home whose local store is plaintext.
func TestFixtureStoresReadFromTheDocument(t *testing.T) {
	common := []string{"zstd blob", "empty file", "file of several chunks", "residue dir", "whiteout", "opaque dir",
		"hardlink in a layer", "tree version 1", "file", "dir", "symlink", "hardlink", "class fs"}
	today := append(common, "tree version 2", "tree version 3", "chunk list", "sparse file", "record version 2",
		"record version 3", "class skip", "journal", "journal chain", "journal delta", "owner line", "mark object", "chardev", "blockdev", "fifo")
	t.Run("store", func(t *testing.T) {
		readFixture(t, "store", legacyManifest(t, "expected.json"), append(common, "record version 1", "legacy sandbox"))
	})
	t.Run("store-v3", func(t *testing.T) {
		readFixture(t, "store-v3", legacyManifest(t, "expected-v3.json"), append(common, "chunk list", "tree version 3", "record version 2"))
	})
	t.Run("bucket", func(t *testing.T) {
		readFixture(t, "bucket", manifest(t, "bucket.json"), append(today, "socket", "blob stored as the other type",
			"record version 4", "process image"))
	})
	t.Run("sealed", func(t *testing.T) {
		readFixture(t, "sealed", manifest(t, "sealed.json"), append(today, "encrypted store", "keyed content IDs", "sealed pack", "sealed object"))
	})
	t.Run("sealed-plainlocal", func(t *testing.T) {
		readFixture(t, "sealed-plainlocal", manifest(t, "sealed-plainlocal.json"), append(today, "encrypted store", "keyed content IDs",
			"sealed pack", "sealed object", "pack named by its plaintext layout"))
	})
}

// TestDamagedStoreIsReportedByObject reads a copy of "store" with a byte of
// a pack flipped, a record cut short and a head's record deleted: each
// damage is an error naming its object.
func TestDamagedStoreIsReportedByObject(t *testing.T) {
	var d Damage
	data, err := os.ReadFile(filepath.Join("testdata", "damaged.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	r := openStore(t, filepath.Join("testdata", "damaged"), "")
	readAll(r, legacyManifest(t, "expected.json"))
	for what, name := range map[string]string{"flipped byte in": d.Flipped, "truncated": d.Truncated, "missing": d.Missing} {
		found := false
		for _, err := range r.errs {
			found = found || strings.Contains(err.Error(), name)
		}
		if !found {
			t.Errorf("no error names the %s object %s; the reader said: %v", what, name, errors.Join(r.errs...))
		}
	}
	if len(r.errs) == 0 {
		t.Fatal("the damaged store read without an error")
	}
	for _, err := range r.errs {
		t.Log(err)
	}
}

func manifest(t *testing.T, name string) *Manifest {
	var m Manifest
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

// legacyManifest reads the expectations of the older fixtures: only what
// each checkpoint's sandbox showed.
func legacyManifest(t *testing.T, name string) *Manifest {
	var files map[string]map[string]Expect
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &files); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Checkpoints: map[string]CheckpointManifest{}}
	for x, f := range files {
		m.Checkpoints[x] = CheckpointManifest{Files: f}
	}
	return m
}

func readFixture(t *testing.T, store string, want *Manifest, exercised []string) {
	keyFile := ""
	if want.KeyFile != "" {
		keyFile = filepath.Join("testdata", want.KeyFile)
	}
	r := openStore(t, filepath.Join("testdata", store), keyFile)
	readAll(r, want)
	for _, err := range r.errs {
		t.Error(err)
	}
	for _, what := range exercised {
		if r.seen[what] == 0 {
			t.Errorf("the fixture has no %s: regenerate it (gen_test.go)", what)
		}
	}
}

// readAll reads every record, ref, sandbox and mark object of the store
// and compares them with the manifest; damage goes to r.errs.
func readAll(r *reader, want *Manifest) {
	records := map[string]record{}
	var names []string
	for name := range r.objects {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasPrefix(name, "records/") {
			r.try(func() { records[strings.TrimPrefix(name, "records/")] = r.readRecord(name) })
		}
	}
	for hexID := range want.Checkpoints {
		if r.objects["records/"+hexID] == nil {
			r.errs = append(r.errs, fmt.Errorf("record records/%s: the writer wrote it, the store lacks it", hexID))
		}
	}
	for hexID, rec := range records {
		r.try(func() { r.checkRecord(hexID, rec, records, want) })
	}
	for _, name := range names {
		r.try(func() { r.checkObject(name, records, want) })
	}
	for name, ref := range want.Refs {
		if r.objects[name] == nil {
			r.errs = append(r.errs, fmt.Errorf("ref %s naming %s: missing", name, ref.Target))
		}
	}
}

func (r *reader) checkRecord(hexID string, rec record, records map[string]record, want *Manifest) {
	name := "records/" + hexID
	exp, ok := want.Checkpoints[hexID]
	if !ok {
		r.fail("record %s: in the store, but its writer made no such checkpoint", name)
	}
	if exp.Version != 0 && (rec.Version != exp.Version || rec.Class != exp.Class || rec.SandboxID != exp.SandboxID ||
		rec.Conv != exp.Conv || rec.ProcChange != exp.ProcChange) {
		r.fail("record %s: version %d class %s sandbox_id %q conv %q proc_change %q; its writer made %+v",
			name, rec.Version, rec.Class, rec.SandboxID, rec.Conv, rec.ProcChange, exp)
	}
	if rec.SandboxID == "" {
		r.seen["legacy sandbox"]++
	}
	base, _ := parseHex(rec.BaseTree)
	layer, _ := parseHex(rec.FSTree)
	if sk := r.stateKey(layer, r.tree(base)); sk.String() != rec.StateKey {
		r.fail("record %s: state key per the document is %s, the record says %s", name, sk, rec.StateKey)
	}
	if rec.Turn == 0 && rec.Parent == "" && rec.StateKey != r.contentID([]byte("TST\x01\x00")).String() {
		r.fail("record %s: turn 0 has a non-empty layer", name)
	}
	if rec.Parent != "" {
		p, ok := records[rec.Parent]
		if ok && rec.Turn != p.Turn+1 {
			r.fail("record %s: turn %d, its parent's %d", name, rec.Turn, p.Turn)
		}
		if ok && rec.Class == "skip" && (rec.BaseTree != p.BaseTree || rec.FSTree != p.FSTree || rec.StateKey != p.StateKey) {
			r.fail("record %s: a skip record whose trees are not its parent's", name)
		}
	}
	if rec.Journal != "" || len(exp.Journal) > 0 {
		jx, err := parseHex(rec.Journal)
		if err != nil {
			r.fail("record %s: no journal; its writer gave it %d exchanges", name, len(exp.Journal))
		}
		got := r.journal(jx)
		if exp.Version != 0 && fmt.Sprint(got) != fmt.Sprint(exp.Journal) {
			r.fail("record %s: journal %v; its writer stored %v", name, got, exp.Journal)
		}
	}
	if exp.Version != 0 && exp.ProcImage != (rec.ProcTree != "") {
		r.fail("record %s: process image %q; its writer made one: %v", name, rec.ProcTree, exp.ProcImage)
	}
	if rec.ProcTree != "" {
		px, _ := parseHex(rec.ProcTree)
		r.procImage(px)
		if len(rec.Host) == 0 {
			r.fail("record %s: a process image without host", name)
		}
	}
	got := r.merge(base, layer)
	for p, x := range exp.Files {
		e, ok := got[p]
		if !ok {
			r.fail("record %s: %s missing from the state", name, p)
		}
		r.compare(name+": "+p, e, x)
	}
	for p := range got {
		if _, ok := exp.Files[p]; !ok {
			r.fail("record %s: %s in the state, not in the sandbox", name, p)
		}
	}
}

// checkObject is "Store layout": refs, sandbox and mark objects, and the
// prefixes the document lists.
func (r *reader) checkObject(name string, records map[string]record, want *Manifest) {
	switch {
	case strings.HasPrefix(name, "refs/heads/"), strings.HasPrefix(name, "refs/tags/"):
		s := string(r.object(name))
		if len(s) > maxSmall {
			r.fail("ref %s: over 64 KiB", name)
		}
		target, rest, ok := strings.Cut(s, "\n")
		if !ok || !hex64.MatchString(target) {
			r.fail("ref %s: not 64 hex digits and a newline", name)
		}
		var owner string
		var epoch uint64
		if rest != "" {
			// A head's owner line: "owner <home id> <epoch>\n".
			f := strings.Fields(strings.TrimSuffix(rest, "\n"))
			if !strings.HasPrefix(name, "refs/heads/") || !strings.HasSuffix(rest, "\n") || strings.Count(rest, "\n") != 1 ||
				len(f) != 3 || f[0] != "owner" || !hex32.MatchString(f[1]) || rest != strings.Join(f, " ")+"\n" {
				r.fail("ref %s: %q after the target is not an owner line", name, rest)
			}
			var err error
			epoch, err = strconv.ParseUint(f[2], 10, 64)
			if err != nil || epoch == 0 || strconv.FormatUint(epoch, 10) != f[2] {
				r.fail("ref %s: owner epoch %q", name, f[2])
			}
			owner = f[1]
			r.seen["owner line"]++
		}
		if _, ok := records[target]; !ok {
			r.fail("ref %s names records/%s, which is missing or unreadable", name, target)
		}
		if exp, ok := want.Refs[name]; ok && (exp.Target != target || exp.Owner != owner || exp.Epoch != epoch) {
			r.fail("ref %s: names %s owner %q epoch %d; its writer wrote %+v", name, target, owner, epoch, exp)
		}
	case strings.HasPrefix(name, "sandboxes/"):
		data := r.object(name)
		var sb struct {
			ID       string          `json:"id,omitempty"`   // "Sandbox identity"
			Home     string          `json:"home,omitempty"` // "Sandbox identity"
			Name     string          `json:"name"`
			Backend  string          `json:"backend"`
			BaseTree string          `json:"base_tree"`
			Origin   string          `json:"origin"`
			Created  string          `json:"created"`
			Config   json.RawMessage `json:"config,omitempty"`
		}
		strictJSON(r, name, data, &sb)
		r.checkTime(name, sb.Created)
		// "Sandbox identity": the key is the id, or a legacy sandbox's name.
		key := strings.TrimPrefix(name, "sandboxes/")
		if (sb.ID != "" && sb.ID != key) || (sb.ID == "" && sb.Name != key) {
			r.fail("sandbox object %s: holds sandbox %q (id %q)", name, sb.Name, sb.ID)
		}
		// "Record", lineage: a branch's first record has the origin as parent.
		if sb.Origin != "" {
			found := false
			for _, rec := range records {
				k := rec.SandboxID
				if k == "" {
					k = rec.Sandbox
				}
				if k == key && rec.Parent == sb.Origin {
					found = true
				}
			}
			if !found {
				r.fail("sandbox object %s: no record has its origin %s as parent", name, sb.Origin)
			}
		}
	case strings.HasPrefix(name, "marks/"):
		data := r.object(name)
		if len(data) > maxMarks {
			r.fail("mark object %s: over 32 MiB", name)
		}
		var m struct {
			Version int    `json:"version"`
			Home    string `json:"home"`
			Records []struct {
				ID      string `json:"id"`
				Sandbox string `json:"sandbox"`
				Marked  string `json:"marked"`
				Due     string `json:"due"`
			} `json:"records"`
		}
		strictJSON(r, name, data, &m)
		if m.Version != 1 || "marks/"+m.Home != name || !hex32.MatchString(m.Home) || len(m.Records) > 100000 {
			r.fail("mark object %s: version %d home %q", name, m.Version, m.Home)
		}
		var ids []string
		for _, x := range m.Records {
			marked, due := r.checkTime(name, x.Marked), r.checkTime(name, x.Due)
			if !hex64.MatchString(x.ID) || slicesContains(ids, x.ID) || due.Before(marked) ||
				!(hex32.MatchString(x.Sandbox) || label.MatchString(x.Sandbox)) {
				r.fail("mark object %s: record %s breaks the rules", name, x.ID)
			}
			// A marked record is still a record.
			if _, ok := records[x.ID]; !ok {
				r.fail("mark object %s: marks records/%s, which is missing", name, x.ID)
			}
			ids = append(ids, x.ID)
		}
		sort.Strings(ids)
		exp := append([]string(nil), want.Marks[name]...)
		sort.Strings(exp)
		if want.Marks != nil && fmt.Sprint(ids) != fmt.Sprint(exp) {
			r.fail("mark object %s: marks %v; its writer marked %v", name, ids, exp)
		}
		r.seen["mark object"]++
	case strings.HasPrefix(name, "keys/"):
		if r.seal == nil {
			r.fail("object %s: a key object in a store read without a key", name)
		}
	case strings.HasPrefix(name, "packs/"), strings.HasPrefix(name, "records/"),
		strings.HasPrefix(name, "hosts/"), strings.HasPrefix(name, "locks/"):
	default:
		r.fail("object %s: not in the document's store layout", name)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (r *reader) compare(what string, e entry, x Expect) {
	if typeNames[e.typ] != x.Type {
		r.fail("%s: %s in the store, %s in the sandbox", what, typeNames[e.typ], x.Type)
	}
	switch e.typ {
	case tFile:
		content := r.content(e)
		if uint64(len(content)) != e.size || blake3Hex(string(content)) != x.Content || (x.Size != 0 && x.Size != int64(e.size)) {
			r.fail("%s: content differs (%d bytes, size %d, the sandbox had %d)", what, len(content), e.size, x.Size)
		}
	case tSymlink, tHardlink:
		if e.target != x.Target {
			r.fail("%s: target %q, the sandbox had %q", what, e.target, x.Target)
		}
		return
	case tChardev, tBlockdev:
		if e.rdev != x.Rdev {
			r.fail("%s: rdev %#x, the sandbox had %#x", what, e.rdev, x.Rdev)
		}
	}
	if e.typ != tDir && e.mtime != x.MtimeNs {
		r.fail("%s: mtime %d, the sandbox had %d", what, e.mtime, x.MtimeNs)
	}
	if uint32(e.mode) != x.Mode {
		r.fail("%s: mode %o, the sandbox had %o", what, e.mode, x.Mode)
	}
	xs := map[string]string{}
	for _, xa := range e.xattrs {
		xs[xa[0]] = xa[1]
	}
	if len(xs) != len(x.Xattrs) || fmt.Sprint(xs) != fmt.Sprint(x.Xattrs) && len(xs) > 0 {
		r.fail("%s: xattrs %v, the sandbox had %v", what, xs, x.Xattrs)
	}
}

// content is a file entry's bytes: "Sparse files", the chunks' bytes laid
// into the data runs, zeros in the holes.
func (r *reader) content(e entry) []byte {
	var data []byte
	for _, c := range e.chunks {
		data = append(data, r.blob(c, 1)...)
	}
	var content []byte
	for _, h := range e.holes {
		k := min(h[0], uint64(len(data)))
		content = append(content, data[:k]...)
		data = data[k:]
		content = append(content, make([]byte, h[1])...)
	}
	return append(content, data...)
}

var journalName = regexp.MustCompile(`^([0-9a-f]{64})\.(-1|0|[1-9][0-9]*)$`)

// journal is "Model-call journal": the exchanges a journal tree's chain
// holds, by file name, as BLAKE3 of each request and response.
func (r *reader) journal(root id) map[string]JournalExpect {
	what := "journal " + root.String()
	var levels []map[string][]byte // the chain, newest first
	total := 0
	for x := &root; x != nil; {
		if len(levels) == 4096 {
			r.fail("%s: a chain of more than 4,096 trees", what)
		}
		level := map[string][]byte{}
		var prev *id
		for _, e := range r.tree(*x) {
			switch {
			case e.name == "prev" && e.typ == tDir && e.mode == 0o700 && e.uid == 0 && e.gid == 0 && e.mtime == 0 && !e.opaque && len(e.xattrs) == 0:
				sub := e.subtree
				prev = &sub
			case journalName.MatchString(e.name) && e.typ == tFile && e.mode == 0o600 && e.uid == 0 && e.gid == 0 && e.mtime == 0 && len(e.xattrs) == 0 && len(e.holes) == 0:
				if e.size > 64<<20 {
					r.fail("%s: %s: %d bytes, over 64 MiB", what, e.name, e.size)
				}
				level[e.name] = r.content(e)
			default:
				r.fail("%s: tree %s: entry %q is not a journal's", what, *x, e.name)
			}
		}
		if prev != nil && len(level) == 0 {
			r.fail("%s: tree %s: prev and no file", what, *x)
		}
		if total += len(level); total > 65536 {
			r.fail("%s: more than 65,536 files", what)
		}
		if prev != nil {
			r.seen["journal chain"]++
		}
		levels = append(levels, level)
		x = prev
	}
	type parsed struct {
		mid, resp []byte
		delta     bool
		base      string
		prefix    int
		suffix    int
		req       string
	}
	parse := func(name string, b []byte) parsed {
		var p parsed
		switch {
		case bytes.HasPrefix(b, []byte("TSJ1")):
		case bytes.HasPrefix(b, []byte("TSJ2")):
			p.delta = true
		default:
			r.fail("%s: %s: no TSJ1 or TSJ2 magic", what, name)
		}
		hb, rest := r.str(what+": "+name, b[4:])
		var mid, resp string
		mid, rest = r.str(what+": "+name, rest)
		resp, rest = r.str(what+": "+name, rest)
		if len(rest) != 0 {
			r.fail("%s: %s: trailing bytes", what, name)
		}
		var h struct {
			Conv            string  `json:"conv"`
			Turn            int     `json:"turn"`
			Shape           string  `json:"shape"`
			Stream          bool    `json:"stream"`
			Status          int     `json:"status"`
			ContentType     string  `json:"content_type"`
			ContentEncoding string  `json:"content_encoding"`
			Base            *string `json:"base"`
			Prefix          *int    `json:"prefix"`
			Suffix          *int    `json:"suffix"`
			Req             *string `json:"req"`
		}
		strictJSON(r, what+": "+name, []byte(hb), &h)
		m := journalName.FindStringSubmatch(name)
		if h.Conv != m[1] || strconv.Itoa(h.Turn) != m[2] {
			r.fail("%s: %s: its header says conv %s turn %d", what, name, h.Conv, h.Turn)
		}
		if p.delta != (h.Base != nil && h.Prefix != nil && h.Suffix != nil && h.Req != nil) ||
			(!p.delta && (h.Base != nil || h.Prefix != nil || h.Suffix != nil || h.Req != nil)) {
			r.fail("%s: %s: delta fields do not match the magic", what, name)
		}
		p.mid, p.resp = []byte(mid), []byte(resp)
		if p.delta {
			bm := journalName.FindStringSubmatch(*h.Base)
			if bm == nil || bm[2] == "-1" || *h.Prefix < 0 || *h.Suffix < 0 {
				r.fail("%s: %s: base %q", what, name, *h.Base)
			}
			if bt, _ := strconv.Atoi(bm[2]); bt >= h.Turn {
				r.fail("%s: %s: base of a later turn", what, name)
			}
			p.base, p.prefix, p.suffix, p.req = *h.Base, *h.Prefix, *h.Suffix, *h.Req
		}
		return p
	}
	var request func(level int, name string, depth int) []byte
	request = func(level int, name string, depth int) []byte {
		for l := level; l < len(levels); l++ {
			b, ok := levels[l][name]
			if !ok {
				continue
			}
			p := parse(name, b)
			if !p.delta {
				return p.mid
			}
			if depth > 65536 {
				r.fail("%s: %s: a delta cycle", what, name)
			}
			r.seen["journal delta"]++
			base := request(l, p.base, depth+1)
			if p.prefix+p.suffix > len(base) {
				r.fail("%s: %s: prefix and suffix exceed the base's request", what, name)
			}
			req := append(append(append([]byte(nil), base[:p.prefix]...), p.mid...), base[len(base)-p.suffix:]...)
			if blake3Hex(string(req)) != p.req {
				r.fail("%s: %s: the rebuilt request does not hash to req", what, name)
			}
			return req
		}
		r.fail("%s: delta base %s is absent", what, name)
		return nil
	}
	out := map[string]JournalExpect{}
	for l := len(levels) - 1; l >= 0; l-- { // the newest tree's file wins
		for name, b := range levels[l] {
			out[name] = JournalExpect{Request: blake3Hex(string(request(l, name, 0))), Response: blake3Hex(string(parse(name, b).resp))}
		}
	}
	r.seen["journal"]++
	return out
}

// procImage is "Process images": a plain state whose root holds
// turnsnap.json, turnsnap's description of the image.
func (r *reader) procImage(x id) {
	what := "process image " + x.String()
	var meta []byte
	var walk func(t id, at string)
	walk = func(t id, at string) {
		for _, e := range r.tree(t) {
			if e.typ == tWhiteout || e.opaque {
				r.fail("%s: %s%s: a whiteout or opaque directory in a plain state", what, at, e.name)
			}
			if e.typ == tFile {
				b := r.content(e)
				if at == "" && e.name == "turnsnap.json" {
					meta = b
				}
			}
			if at == "" && !strings.HasSuffix(e.name, ".img") && e.name != "descriptors.json" && e.name != "turnsnap.json" {
				r.fail("%s: %s is not a CRIU image, descriptors.json or turnsnap.json", what, e.name)
			}
			if e.typ == tDir {
				walk(e.subtree, at+e.name+"/")
			}
		}
	}
	walk(x, "")
	var m struct {
		Format    int    `json:"format"`
		Container string `json:"container"`
		Options   struct {
			Hostname string   `json:"hostname"`
			Env      []string `json:"env"`
			Init     []string `json:"init"`
		} `json:"options"`
		Host     json.RawMessage `json:"host"`
		Taken    string          `json:"taken"`
		Bytes    int64           `json:"bytes"`
		Files    int64           `json:"files"`
		DumpTime int64           `json:"dump_time"`
	}
	if meta == nil {
		r.fail("%s: no turnsnap.json", what)
	}
	strictJSON(r, what+": turnsnap.json", meta, &m)
	r.checkTime(what, m.Taken)
	if m.Format != 1 {
		r.fail("%s: turnsnap.json format %d", what, m.Format)
	}
	r.seen["process image"]++
}

func blake3Hex(s string) string {
	x := blake3.Sum256([]byte(s))
	return hex.EncodeToString(x[:])
}

// TestReaderImportsNoTurnsnapPackage keeps the reader honest: only the
// generator may use turnsnap's own code.
func TestReaderImportsNoTurnsnapPackage(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "gen_test.go" {
			continue
		}
		pf, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range pf.Imports {
			if strings.HasPrefix(strings.Trim(im.Path.Value, `"`), "github.com/turnsnap/") {
				t.Errorf("%s imports %s: the reader must work from docs/FORMAT.md alone", f, im.Path.Value)
			}
		}
	}
}

// TestSealedDamageIsReportedByObject damages a copy of the encrypted
// bucket: a byte of a sealed tag flipped, and one sandbox object stored
// under the other's name (the seal binds the name, "Encrypted stores").
// Each is an error naming its object.
func TestSealedDamageIsReportedByObject(t *testing.T) {
	want := manifest(t, "sealed.json")
	src := filepath.Join("testdata", "sealed")
	dst := t.TempDir()
	var sandboxes []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := filepath.ToSlash(strings.TrimPrefix(p, src+"/"))
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if name == "refs/tags/good" {
			b[len(b)/2] ^= 1
		}
		if strings.HasPrefix(name, "sandboxes/") {
			sandboxes = append(sandboxes, name)
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(name)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, name), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(sandboxes)
	if len(sandboxes) < 2 {
		t.Fatal("the sealed fixture has fewer than two sandboxes")
	}
	b, err := os.ReadFile(filepath.Join(dst, sandboxes[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, sandboxes[1]), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := openStore(t, dst, filepath.Join("testdata", want.KeyFile))
	readAll(r, want)
	for _, name := range []string{"refs/tags/good", sandboxes[1]} {
		found := false
		for _, err := range r.errs {
			found = found || strings.Contains(err.Error(), "object "+name+": sealed bytes do not open")
		}
		if !found {
			t.Errorf("no error says %s does not open; the reader said: %v", name, errors.Join(r.errs...))
		}
	}
	if len(r.errs) != 2 {
		t.Errorf("%d errors for two damaged objects: %v", len(r.errs), errors.Join(r.errs...))
	}
}
