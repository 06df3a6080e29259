package formatcheck

// A reader of docs/FORMAT.md written from the document alone: it imports
// none of turnsnap's packages, only BLAKE3 and zstd, and every rule below
// cites the section it comes from.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"
)

// Expect is what a path looked like in the mounted sandbox when the fixture
// was made (gen_test.go).
type Expect struct {
	Type    string            `json:"type"`
	Mode    uint32            `json:"mode,omitempty"`
	Content string            `json:"blake3,omitempty"` // of the file's content
	Target  string            `json:"target,omitempty"`
	MtimeNs int64             `json:"mtime_ns,omitempty"`
	Xattrs  map[string]string `json:"xattrs,omitempty"`
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
	maxData, maxTree                            = 262144, 33554432 // "Limits"
	maxInline, maxListChunks                    = 16, 1048575      // "Indirect chunk lists"
)

type reader struct {
	t       *testing.T
	objects map[string][]byte
	index   map[id]loc
	dec     *zstd.Decoder
	seen    map[string]int // what the fixture exercised, for the coverage check
}

func openStore(t *testing.T, dir string) *reader {
	r := &reader{t: t, objects: map[string][]byte{}, index: map[id]loc{}, seen: map[string]int{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		r.objects[strings.TrimPrefix(p, dir+"/")] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.dec, err = zstd.NewReader(nil, zstd.WithDecodeAllCapLimit(true)); err != nil {
		t.Fatal(err)
	}
	// "Finding a blob without the catalog": every pack header.
	packName := regexp.MustCompile(`^packs/([0-9a-f]{2})/([0-9a-f]{64})$`)
	for name, data := range r.objects {
		if !strings.HasPrefix(name, "packs/") {
			continue
		}
		m := packName.FindStringSubmatch(name)
		if m == nil || m[2][:2] != m[1] {
			t.Fatalf("%s: not a pack name", name)
		}
		if got := blake3.Sum256(data); hex.EncodeToString(got[:]) != m[2] {
			t.Fatalf("%s: pack ID is not BLAKE3 of the whole pack", name)
		}
		r.readHeader(name, data)
	}
	return r
}

func uvarint(t *testing.T, b []byte) (uint64, []byte) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		t.Fatal("bad uvarint")
	}
	return v, b[n:]
}

func (r *reader) readHeader(name string, data []byte) {
	t := r.t
	if len(data) < 8 || string(data[len(data)-4:]) != "TSP1" {
		t.Fatalf("%s: no footer", name)
	}
	hlen := uint64(binary.LittleEndian.Uint32(data[len(data)-8:]))
	start := uint64(len(data)) - 8 - hlen
	h := data[start : len(data)-8]
	n, h := uvarint(t, h)
	if n == 0 {
		t.Fatalf("%s: writers never write an empty pack", name)
	}
	var next uint64
	for range n {
		var l loc
		var x id
		l.pack, l.typ = name, h[0]
		copy(x[:], h[1:33])
		h = h[33:]
		l.off, h = uvarint(t, h)
		l.length, h = uvarint(t, h)
		l.raw, h = uvarint(t, h)
		l.comp, h = h[0], h[1:]
		switch {
		case l.off != next:
			t.Fatalf("%s: blob %s not where the previous ends", name, x)
		case l.typ != 1 && l.typ != 2, l.comp > 1:
			t.Fatalf("%s: unknown type or compression", name)
		case l.typ == 1 && l.raw > maxData, l.typ == 2 && l.raw > maxTree:
			t.Fatalf("%s: raw_length over the limit", name)
		case l.comp == 0 && l.raw != l.length:
			t.Fatalf("%s: uncompressed with raw_length != length", name)
		}
		next = l.off + l.length
		r.index[x] = l
	}
	if len(h) != 0 || next != start {
		t.Fatalf("%s: header does not end the blobs exactly", name)
	}
}

// blob is "Blob storage": bounded decompression, then the hash.
func (r *reader) blob(x id, typ byte) []byte {
	t := r.t
	l, ok := r.index[x]
	if !ok {
		t.Fatalf("blob %s (type %d) in no pack", x, typ)
	}
	if l.typ != typ {
		// "Content IDs": the same bytes as the other type serve, within
		// this type's limit.
		if most := map[byte]uint64{1: maxData, 2: maxTree}[typ]; l.raw > most {
			t.Fatalf("blob %s: stored as type %d, %d bytes, over type %d's limit", x, l.typ, l.raw, typ)
		}
		r.seen["blob stored as the other type"]++
	}
	b := r.objects[l.pack][l.off : l.off+l.length]
	if l.comp == 1 {
		r.seen["zstd blob"]++
		out, err := r.dec.DecodeAll(b, make([]byte, 0, l.raw+1))
		if err != nil || uint64(len(out)) != l.raw {
			t.Fatalf("blob %s: zstd frame is not %d bytes: %v", x, l.raw, err)
		}
		b = out
	}
	if blake3.Sum256(b) != x {
		t.Fatalf("blob %s: plaintext does not hash to its ID", x)
	}
	return b
}

func str(t *testing.T, b []byte) (string, []byte) {
	n, b := uvarint(t, b)
	return string(b[:n]), b[n:]
}

func (r *reader) tree(x id) []entry {
	t := r.t
	data := r.blob(x, 2)
	if len(data) < 4 || !bytes.HasPrefix(data, []byte("TST")) || data[3] < 1 || data[3] > 3 {
		t.Fatalf("tree %s: bad magic or unknown version", x)
	}
	version := data[3]
	r.seen[fmt.Sprintf("tree version %d", version)]++
	n, b := uvarint(t, data[4:])
	es := make([]entry, n)
	for i := range es {
		e := &es[i]
		e.name, b = str(t, b)
		e.typ, b = b[0], b[1:]
		e.mode, b = uvarint(t, b)
		e.uid, b = uvarint(t, b)
		e.gid, b = uvarint(t, b)
		var k int
		e.mtime, k = binary.Varint(b)
		b = b[k:]
		flags := b[0]
		e.opaque, b = flags&1 != 0, b[1:]
		var nx uint64
		nx, b = uvarint(t, b)
		for range nx {
			var xn, xv string
			xn, b = str(t, b)
			xv, b = str(t, b)
			e.xattrs = append(e.xattrs, [2]string{xn, xv})
		}
		switch e.typ {
		case tFile:
			var nc uint64
			e.size, b = uvarint(t, b)
			nc, b = uvarint(t, b)
			if version == 3 && nc > maxInline {
				// "Indirect chunk lists": one ID, the count bounded first.
				if nc > maxListChunks {
					t.Fatalf("tree %s: %s: %d chunks, over the list limit", x, e.name, nc)
				}
				copy(e.list[:], b)
				b = b[32:]
			} else {
				if nc > uint64(len(b))/32 {
					t.Fatalf("tree %s: %s: %d chunks exceed the tree", x, e.name, nc)
				}
				for range nc {
					var c id
					copy(c[:], b)
					e.chunks, b = append(e.chunks, c), b[32:]
				}
			}
			if version >= 2 {
				var nh uint64
				nh, b = uvarint(t, b)
				for range nh {
					var h [2]uint64
					h[0], b = uvarint(t, b)
					h[1], b = uvarint(t, b)
					e.holes = append(e.holes, h)
				}
			}
			// "Chunks": an empty file has no chunks; nc <= data <= nc*256KiB,
			// data being the size less the holes.
			data := e.size
			for _, h := range e.holes {
				data -= h[1]
			}
			if nc > data || data > nc*maxData {
				t.Fatalf("tree %s: %s: %d data bytes in %d chunks", x, e.name, data, nc)
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
			copy(e.subtree[:], b)
			b = b[32:]
		case tSymlink, tHardlink:
			e.target, b = str(t, b)
		case 6, 7:
			e.rdev, b = uvarint(t, b)
		}
		if i > 0 && es[i-1].name >= e.name || flags&^1 != 0 || e.mode&^07777 != 0 {
			t.Fatalf("tree %s: entry %q breaks a tree invariant", x, e.name)
		}
	}
	if len(b) != 0 {
		t.Fatalf("tree %s: trailing bytes", x)
	}
	if !bytes.Equal(encode(es), data) { // rule 7
		t.Fatalf("tree %s: not canonically encoded", x)
	}
	return es
}

// chunkList is "Indirect chunk lists": a tree blob with its own magic,
// canonical, of exactly the entry's nc chunks.
func (r *reader) chunkList(x id, nc uint64) []id {
	t := r.t
	data := r.blob(x, 2)
	if !bytes.HasPrefix(data, []byte("TSL\x01")) {
		t.Fatalf("chunk list %s: bad magic or version", x)
	}
	n, b := uvarint(t, data[4:])
	if n != nc || n <= maxInline || n > maxListChunks || uint64(len(b)) != 32*n ||
		len(data)-4-len(b) != len(binary.AppendUvarint(nil, n)) {
		t.Fatalf("chunk list %s: %d chunks in %d bytes, its entry says %d", x, n, len(b), nc)
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
		case 6, 7:
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
			empty := blake3.Sum256([]byte("TST\x01\x00"))
			if !e.opaque && e.subtree == empty && bd != nil && bd.mode == e.mode && bd.uid == e.uid &&
				bd.gid == e.gid && fmt.Sprint(bd.xattrs) == fmt.Sprint(e.xattrs) {
				r.seen["residue dir"]++
				continue // residue
			}
		}
		out = append(out, e)
	}
	return blake3.Sum256(encode(out))
}

// merge is "Writable layers and layer stacks": the state a process sees,
// by root-relative path.
func (r *reader) merge(baseTree, layer id) map[string]entry {
	out := map[string]entry{}
	var walk func(x id, at string, fromLayer bool)
	walk = func(x id, at string, fromLayer bool) {
		for _, e := range r.tree(x) {
			p := strings.TrimPrefix(at+"/"+e.name, "/")
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
	walk(baseTree, "", false)
	walk(layer, "", true)
	return out
}

// record is "Record": every field, nothing else.
type record struct {
	Version  int             `json:"version"`
	Sandbox  string          `json:"sandbox"`
	ID       string          `json:"sandbox_id,omitempty"` // "Sandbox identity", record version 2
	Parent   string          `json:"parent"`
	Turn     int64           `json:"turn"`
	Class    string          `json:"class"`
	Backend  string          `json:"backend"`
	BaseTree string          `json:"base_tree"`
	FSTree   string          `json:"fs_tree"`
	StateKey string          `json:"state_key"`
	ProcTree string          `json:"proc_tree,omitempty"`
	Host     json.RawMessage `json:"host,omitempty"`
	Message  string          `json:"message,omitempty"`
	Created  string          `json:"created"`
	Stats    struct {
		Entries, FilesRead, BytesRead, BlobsNew, BytesNew, ObjectsNew, DurationNs, PauseNs *int64
	} `json:"-"`
	RawStats map[string]int64 `json:"stats"`
}

func strictJSON(t *testing.T, name string, data []byte, v any) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func checkTime(t *testing.T, what, s string) {
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !strings.HasSuffix(s, "Z") || tm.Format(time.RFC3339Nano) != s {
		t.Fatalf("%s: time %q is not RFC 3339 UTC with trimmed nanoseconds", what, s)
	}
}

// TestFixtureStoreReadsFromTheDocument reads two fixture stores: "store",
// written before indirect chunk lists (every tree version 1), which every
// later reader must still read, and "store-v3", written with them (a file
// of more than 16 chunks names a chunk list in a version 3 tree).
func TestFixtureStoreReadsFromTheDocument(t *testing.T) {
	common := []string{"zstd blob", "empty file", "file of several chunks", "residue dir", "whiteout", "opaque dir", "hardlink in a layer", "tree version 1"}
	t.Run("store", func(t *testing.T) { readFixture(t, "store", "expected.json", common) })
	t.Run("store-v3", func(t *testing.T) {
		readFixture(t, "store-v3", "expected-v3.json", append(common, "chunk list", "tree version 3"))
	})
}

func readFixture(t *testing.T, store, expected string, exercised []string) {
	r := openStore(t, filepath.Join("testdata", store))
	var want map[string]map[string]Expect
	data, err := os.ReadFile(filepath.Join("testdata", expected))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	records := map[string]record{}
	stats := []string{"entries", "files_read", "bytes_read", "blobs_new", "bytes_new", "objects_new", "duration_ns", "pause_ns"}
	for name, data := range r.objects {
		hexID, ok := strings.CutPrefix(name, "records/")
		if !ok {
			continue
		}
		if x := blake3.Sum256(data); hex.EncodeToString(x[:]) != hexID {
			t.Fatalf("%s: name is not BLAKE3 of the record", name)
		}
		var rec record
		strictJSON(t, name, data, &rec)
		for k := range rec.RawStats {
			if !strings.Contains(strings.Join(stats, " "), k) {
				t.Fatalf("%s: stats field %q is not in the document", name, k)
			}
		}
		checkTime(t, name, rec.Created)
		// Record versions 1 and 2 ("Versioning and change log"): neither
		// fixture has a model-call journal or a process change.
		if rec.Version < 1 || rec.Version > 2 || (rec.Version == 2) != (rec.ID != "") || (rec.Class != "fs" && rec.Class != "process" && rec.Class != "full" && rec.Class != "skip") {
			t.Fatalf("%s: version %d class %q", name, rec.Version, rec.Class)
		}
		records[hexID] = rec
	}
	if len(records) != len(want) {
		t.Fatalf("%d records, fixture made %d checkpoints", len(records), len(want))
	}
	for hexID, rec := range records {
		base, _ := parseHex(rec.BaseTree)
		layer, _ := parseHex(rec.FSTree)
		if sk := r.stateKey(layer, r.tree(base)); sk.String() != rec.StateKey {
			t.Errorf("record %s: state key per the document is %s, the record says %s", hexID[:12], sk, rec.StateKey)
		}
		if rec.Turn == 0 && (rec.Parent != "" || rec.StateKey != blake3Hex("TST\x01\x00")) {
			t.Errorf("record %s: turn 0 has a parent or a non-empty layer", hexID[:12])
		}
		if rec.Parent != "" {
			p, ok := records[rec.Parent]
			if !ok || rec.Turn != p.Turn+1 {
				t.Errorf("record %s: parent %s missing or turn not parent's + 1", hexID[:12], rec.Parent)
			}
		}
		got := r.merge(base, layer)
		exp := want[hexID]
		for p, x := range exp {
			e, ok := got[p]
			if !ok {
				t.Errorf("record %s: %s missing from the state", hexID[:12], p)
				continue
			}
			r.compare(t, hexID[:12]+" "+p, e, x)
		}
		for p := range got {
			if _, ok := exp[p]; !ok {
				t.Errorf("record %s: %s in the state, not in the sandbox", hexID[:12], p)
			}
		}
	}
	for _, what := range exercised {
		if r.seen[what] == 0 {
			t.Errorf("the fixture has no %s: regenerate it (gen_test.go)", what)
		}
	}
	// "Store layout": refs, tags and sandbox objects.
	for name, data := range r.objects {
		switch {
		case strings.HasPrefix(name, "refs/heads/"), strings.HasPrefix(name, "refs/tags/"):
			s := string(data)
			if !strings.HasSuffix(s, "\n") || len(s) != 65 {
				t.Fatalf("%s: not 64 hex digits and a newline", name)
			}
			if _, ok := records[s[:64]]; !ok {
				t.Fatalf("%s names no record", name)
			}
		case strings.HasPrefix(name, "sandboxes/"):
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
			strictJSON(t, name, data, &sb)
			checkTime(t, name, sb.Created)
			// Named by name before "Sandbox identity", by ID since.
			if key := strings.TrimPrefix(name, "sandboxes/"); sb.Name != key && (sb.ID == "" || sb.ID != key) {
				t.Fatalf("%s: names sandbox %q", name, sb.Name)
			}
			// "Record", lineage: a branch's first record has the origin as parent.
			if sb.Origin != "" {
				found := false
				for _, rec := range records {
					if rec.Sandbox == sb.Name && records[rec.Parent].Sandbox != sb.Name {
						found = rec.Parent == sb.Origin
					}
				}
				if !found {
					t.Errorf("%s: no first record whose parent is the origin %s", name, sb.Origin)
				}
			}
		case strings.HasPrefix(name, "packs/"), strings.HasPrefix(name, "records/"):
		default:
			t.Errorf("%s: an object the document does not list", name)
		}
	}
}

func blake3Hex(s string) string {
	x := blake3.Sum256([]byte(s))
	return hex.EncodeToString(x[:])
}

func (r *reader) compare(t *testing.T, what string, e entry, x Expect) {
	types := map[byte]string{tFile: "file", tDir: "dir", tSymlink: "symlink", tHardlink: "hardlink"}
	if types[e.typ] != x.Type {
		t.Errorf("%s: %s in the store, %s in the sandbox", what, types[e.typ], x.Type)
		return
	}
	switch e.typ {
	case tFile:
		var data []byte
		for _, c := range e.chunks {
			data = append(data, r.blob(c, 1)...)
		}
		// "Sparse files": the chunks' bytes laid into the data runs, zeros
		// in the holes.
		var content []byte
		for _, h := range e.holes {
			k := min(h[0], uint64(len(data)))
			content = append(content, data[:k]...)
			data = data[k:]
			content = append(content, make([]byte, h[1])...)
		}
		content = append(content, data...)
		if uint64(len(content)) != e.size || blake3Hex(string(content)) != x.Content {
			t.Errorf("%s: content differs (%d bytes, size %d)", what, len(content), e.size)
		}
		if e.mtime != x.MtimeNs {
			t.Errorf("%s: mtime %d, sandbox had %d", what, e.mtime, x.MtimeNs)
		}
	case tSymlink, tHardlink:
		if e.target != x.Target {
			t.Errorf("%s: target %q, sandbox had %q", what, e.target, x.Target)
		}
		return
	}
	if uint32(e.mode) != x.Mode {
		t.Errorf("%s: mode %o, sandbox had %o", what, e.mode, x.Mode)
	}
	xs := map[string]string{}
	for _, xa := range e.xattrs {
		xs[xa[0]] = xa[1]
	}
	if len(xs) != len(x.Xattrs) || fmt.Sprint(xs) != fmt.Sprint(x.Xattrs) && len(xs) > 0 {
		t.Errorf("%s: xattrs %v, sandbox had %v", what, xs, x.Xattrs)
	}
}
