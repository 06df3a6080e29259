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
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"
	"golang.org/x/crypto/chacha20poly1305"
)

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
