package formatcheck

// The reader, continued: records, refs, sandbox and mark objects, the
// model-call journal and process images ("Record" to "Store layout"), and
// the comparison of a state with what its writer's sandbox showed.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/blake3"
)

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
		// Since 2026-12-07 a skip record carries its parent's journal;
		// older ones carry none ("Skip records").
		if ok && rec.Class == "skip" && (rec.Conv != "" || rec.ProcChange != "" || (rec.Journal != "" && rec.Journal != p.Journal)) {
			r.fail("record %s: a skip record with a conv, a proc_change or a journal not its parent's", name)
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
