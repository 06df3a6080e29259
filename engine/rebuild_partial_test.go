package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/history"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/hostile"
	"github.com/turnsnap/turnsnap/upload"
)

// healthyPair is two sandboxes over different bases, each with a turn: what
// every case of the bad-object table must restore whole.
type healthyPair struct {
	names [2]string
	sbs   [2]*delta.Sandbox
	heads [2]*delta.Checkpoint
	files [2]string // the content of turn.txt at each head
}

func makeHealthyPair(t *testing.T, e *Engine) *healthyPair {
	t.Helper()
	ctx := context.Background()
	hp := &healthyPair{names: [2]string{"h1", "h2"}}
	for i, name := range hp.names {
		base := t.TempDir()
		write(t, filepath.Join(base, "a.txt"), "base of "+name+"\n")
		cr, err := e.CreateSandbox(ctx, delta.SandboxName(name), CreateOptions{Base: base})
		must(t, err)
		hp.files[i] = "turn of " + name + "\n"
		write(t, filepath.Join(cr.Root, "turn.txt"), hp.files[i])
		r, err := e.Checkpoint(ctx, delta.SandboxName(name), CheckpointOptions{})
		must(t, err)
		hp.heads[i], err = e.Resolve(ctx, mustRef(r.ID.String()))
		must(t, err)
		hp.sbs[i] = cr.Sandbox
	}
	return hp
}

// checkRestored is the table's oracle: both healthy sandboxes are in the
// rebuilt catalog under their names, with their heads, and each head
// verifies (every blob re-hashed). With branch, each head is also branched
// and its file read back.
func (hp *healthyPair) checkRestored(t *testing.T, e *Engine, branch bool) {
	t.Helper()
	ctx := context.Background()
	sbs, err := e.ListSandboxes(ctx)
	must(t, err)
	heads := map[string]delta.ID{}
	for _, si := range sbs {
		if si.Head != nil {
			heads[string(si.Sandbox.Name)] = si.Head.ID
		}
	}
	for i, name := range hp.names {
		if heads[name] != hp.heads[i].ID {
			t.Fatalf("sandbox %s after the rebuild: head %s, want %s (sandboxes %v)", name, heads[name].Short(), hp.heads[i].ID.Short(), heads)
		}
		if _, err := e.Verifier().Verify(ctx, mustRef(hp.heads[i].ID.String())); err != nil {
			t.Fatalf("verify of %s's head after the rebuild: %v", name, err)
		}
		if !branch {
			continue
		}
		br, err := e.Branch(ctx, mustRef(hp.heads[i].ID.String()), delta.SandboxName(name+"-copy"), BranchOptions{})
		must(t, err)
		if got, err := os.ReadFile(filepath.Join(br.Root, "turn.txt")); err != nil || string(got) != hp.files[i] {
			t.Fatalf("branch of %s's head: turn.txt %q %v, want %q", name, got, err, hp.files[i])
		}
	}
}

// badObject is one case of the table: put writes the bad object(s) into
// the store beside the healthy pair and returns the object the rebuild must
// name, with its class.
type badObject struct {
	name string
	put  func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error)
}

func putNamed(ctx context.Context, s upload.Store, name string, data []byte) error {
	return upload.PutBytes(ctx, s, name, data)
}

// putPack stores data under the pack name of its (unmangled) content.
func putPack(ctx context.Context, s upload.Store, blobs []hostile.Blob, mangle func([]byte) []byte) (string, error) {
	data, id := hostile.EncodePack(blobs)
	name := delta.PackName(id)
	return name, putNamed(ctx, s, name, mangle(data))
}

// storeRecord stores cp's canonical encoding under its name.
func storeRecord(ctx context.Context, s upload.Store, cp *delta.Checkpoint) (string, error) {
	data, id, err := delta.EncodeRecord(cp)
	if err != nil {
		return "", err
	}
	return delta.RecordName(id), putNamed(ctx, s, delta.RecordName(id), data)
}

// ghost stores the description of a third sandbox over h1's base (a valid
// one), and a head object holding head; the head is what must be named.
func ghost(ctx context.Context, s upload.Store, hp *healthyPair, base delta.ID, head []byte) (string, error) {
	sb := delta.Sandbox{ID: delta.NewSandboxID(), Name: "ghost", Backend: hp.sbs[0].Backend, BaseTree: base, Created: time.Now().UTC()}
	data, err := json.Marshal(sb)
	if err != nil {
		return "", err
	}
	if err := putNamed(ctx, s, delta.SandboxObject(delta.SandboxKey(sb.ID)), data); err != nil {
		return "", err
	}
	name := delta.HeadObject(delta.SandboxKey(sb.ID))
	return name, putNamed(ctx, s, name, head)
}

// onTop is a record of h1 whose layer is root, as a later turn would be.
func onTop(hp *healthyPair, root delta.ID) *delta.Checkpoint {
	p := hp.heads[0]
	return &delta.Checkpoint{Version: p.Version, Sandbox: p.Sandbox, SandboxID: p.SandboxID, Parent: p.ID, Turn: p.Turn + 1,
		Class: delta.ClassFS, Backend: p.Backend, BaseTree: p.BaseTree, FSTree: root, StateKey: root, Created: time.Now().UTC()}
}

func badObjects() []badObject {
	hello := hostile.Plain(delta.BlobData, []byte("hello\n"))
	tree := hostile.Tree(&delta.Tree{Entries: []delta.Entry{{Name: "f", Type: delta.TypeFile, Mode: 0o644, Size: 6, Chunks: []delta.ID{hello.ID}}}})
	pack := func(mangle func([]byte) []byte) func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
		return func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := putPack(ctx, s, []hostile.Blob{hello, tree}, mangle)
			return name, SkipCorrupt, err
		}
	}
	lying := func(i int) func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
		return func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := putPack(ctx, s, hostile.LyingHeaders()[i], func(b []byte) []byte { return b })
			return name, SkipCorrupt, err
		}
	}
	// record stores a record of the given bytes under the name of their hash.
	record := func(data func(hp *healthyPair) []byte) func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
		return func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			d := data(hp)
			name := delta.RecordName(delta.Hash(d))
			return name, SkipCorrupt, putNamed(ctx, s, name, d)
		}
	}
	h1Record := func(hp *healthyPair) []byte {
		data, _, _ := delta.EncodeRecord(hp.heads[0])
		return data
	}
	return []badObject{
		{"pack-truncated", pack(func(b []byte) []byte { return b[:len(b)/2] })},
		{"pack-too-short", pack(func(b []byte) []byte { return b[:3] })},
		{"pack-bad-magic", pack(func(b []byte) []byte { b = bytes.Clone(b); copy(b[len(b)-4:], "XXXX"); return b })},
		{"pack-header-length-past-start", pack(func(b []byte) []byte {
			b = bytes.Clone(b)
			binary.LittleEndian.PutUint32(b[len(b)-8:], uint32(len(b)))
			return b
		})},
		{"pack-garbled-header", pack(func(b []byte) []byte {
			b = bytes.Clone(b)
			hlen := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
			for i := len(b) - 8 - hlen; i < len(b)-8; i++ {
				b[i] = 0xff
			}
			return b
		})},
		{"pack-data-shorter-than-header-says", pack(func(b []byte) []byte { return b[5:] })},
		{"pack-huge-blob-count", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			header := binary.AppendUvarint(nil, 1<<40)
			header = append(header, make([]byte, 64)...)
			data := binary.LittleEndian.AppendUint32(header, uint32(len(header)))
			data = append(data, "TSP1"...)
			name := delta.PackName(delta.Hash(data))
			return name, SkipCorrupt, putNamed(ctx, s, name, data)
		}},
		{"pack-raw-length-2^36", lying(0)},
		{"pack-raw-length-2^64-1", lying(2)},
		{"pack-shadowing-a-healthy-tree", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			// A valid header claiming h1's layer tree, holding garbage: the
			// rebuild must read the tree from its real pack.
			b := hostile.Blob{Type: delta.BlobTree, ID: hp.heads[0].FSTree, Stored: []byte("not that tree"), RawLength: 13}
			name, err := putPack(ctx, s, []hostile.Blob{b}, func(b []byte) []byte { return b })
			return name, SkipCorrupt, err
		}},
		{"record-bad-json", record(func(*healthyPair) []byte { return []byte(`{"version": 2, "sandbox": `) })},
		{"record-newer-version", record(func(*healthyPair) []byte { return []byte(`{"version": 99}`) })},
		{"record-not-canonical", record(func(hp *healthyPair) []byte {
			var v map[string]any
			json.Unmarshal(h1Record(hp), &v)
			data, _ := json.MarshalIndent(v, "", "  ")
			return data
		})},
		{"record-wrong-hash", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name := delta.RecordName(delta.Hash([]byte("another record")))
			return name, SkipCorrupt, putNamed(ctx, s, name, h1Record(hp))
		}},
		{"record-oversized", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			data := bytes.Repeat([]byte(" "), delta.MaxRecordSize+10)
			name := delta.RecordName(delta.Hash(data))
			return name, SkipCorrupt, putNamed(ctx, s, name, data)
		}},
		{"record-naming-missing-trees", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := storeRecord(ctx, s, onTop(hp, delta.Hash([]byte("a tree in no pack"))))
			return name, SkipMissingObjects, err
		}},
		{"record-naming-missing-chunks", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			if _, err := hostile.WritePack(ctx, s, []hostile.Blob{tree}); err != nil { // the tree, not its chunk
				return "", "", err
			}
			name, err := storeRecord(ctx, s, onTop(hp, tree.ID))
			return name, SkipMissingObjects, err
		}},
		{"record-tree-does-not-decode", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			junk := hostile.Plain(delta.BlobTree, []byte("\x07not a tree encoding at all"))
			if _, err := hostile.WritePack(ctx, s, []hostile.Blob{junk}); err != nil {
				return "", "", err
			}
			name, err := storeRecord(ctx, s, onTop(hp, junk.ID))
			return name, SkipCorrupt, err
		}},
		{"record-naming-another-sandboxs-key", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			// h1's layer put into h2's history: over h1's base, not h2's.
			cp := onTop(hp, hp.heads[0].FSTree)
			cp.SandboxID, cp.Sandbox = hp.heads[1].SandboxID, hp.heads[1].Sandbox
			name, err := storeRecord(ctx, s, cp)
			return name, SkipCorrupt, err
		}},
		{"description-bad-json", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name := delta.SandboxObject(delta.SandboxKey(delta.NewSandboxID()))
			return name, SkipCorrupt, putNamed(ctx, s, name, []byte(`{"id": `))
		}},
		{"description-under-the-wrong-key", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			real, err := upload.ReadAll(ctx, s, delta.SandboxObject(delta.SandboxKey(hp.sbs[0].ID)))
			if err != nil {
				return "", "", err
			}
			name := delta.SandboxObject(delta.SandboxKey(delta.NewSandboxID()))
			return name, SkipCorrupt, putNamed(ctx, s, name, real)
		}},
		{"description-oversized", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name := delta.SandboxObject(delta.SandboxKey(delta.NewSandboxID()))
			return name, SkipCorrupt, putNamed(ctx, s, name, bytes.Repeat([]byte("{"), delta.MaxSmallObject+1))
		}},
		{"description-without-a-head", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			head, err := ghost(ctx, s, hp, hp.sbs[0].BaseTree, nil)
			if err != nil {
				return "", "", err
			}
			key := strings.TrimPrefix(head, delta.HeadPrefix)
			return delta.SandboxObject(delta.SandboxKey(key)), SkipMissingObjects, s.Delete(ctx, head)
		}},
		{"head-garbage", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := ghost(ctx, s, hp, hp.sbs[0].BaseTree, []byte("\x00\x01garbage"))
			return name, SkipCorrupt, err
		}},
		{"head-malformed-owner-line", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := ghost(ctx, s, hp, hp.sbs[0].BaseTree, []byte(hp.heads[0].ID.String()+"\nowner nobody -1\n"))
			return name, SkipCorrupt, err
		}},
		{"head-oversized", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := ghost(ctx, s, hp, hp.sbs[0].BaseTree, bytes.Repeat([]byte("0"), delta.MaxSmallObject+1))
			return name, SkipCorrupt, err
		}},
		{"head-dangling", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := ghost(ctx, s, hp, hp.sbs[0].BaseTree, delta.EncodeRef(delta.Hash([]byte("a record never stored"))))
			return name, SkipDangling, err
		}},
		{"head-naming-a-record-with-missing-trees", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			rec, err := storeRecord(ctx, s, onTop(hp, delta.Hash([]byte("another tree in no pack"))))
			if err != nil {
				return "", "", err
			}
			id, _ := delta.ParseID(strings.TrimPrefix(rec, delta.RecordPrefix))
			name, err := ghost(ctx, s, hp, hp.sbs[0].BaseTree, delta.EncodeRef(id))
			return name, SkipMissingObjects, err
		}},
		{"head-naming-a-checkpoint-over-another-base", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name, err := ghost(ctx, s, hp, hp.sbs[1].BaseTree, delta.EncodeRef(hp.heads[0].ID))
			return name, SkipCorrupt, err
		}},
		{"tag-garbage", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name := delta.RefName(delta.RefTag, "junk")
			return name, SkipCorrupt, putNamed(ctx, s, name, []byte("zz\n"))
		}},
		{"tag-dangling", func(ctx context.Context, s upload.Store, hp *healthyPair) (string, SkipClass, error) {
			name := delta.RefName(delta.RefTag, "gone")
			return name, SkipDangling, putNamed(ctx, s, name, delta.EncodeRef(delta.Hash([]byte("pruned elsewhere"))))
		}},
	}
}

// storeCopy makes a home holding nothing but a copy of src's store, as a
// second host would have.
func storeCopy(t *testing.T, src *Engine) (string, upload.Store) {
	t.Helper()
	home := filepath.Join(t.TempDir(), "home")
	must(t, os.MkdirAll(home, 0o700))
	if out, err := exec.Command("cp", "-a", src.home.storeDir(), filepath.Join(home, "store")).CombinedOutput(); err != nil {
		t.Fatalf("copy store: %v: %s", err, out)
	}
	store, err := upload.NewLocal(filepath.Join(home, "store"))
	must(t, err)
	return home, store
}

// wantSkipped checks that rep is partial and names object with class.
func wantSkipped(t *testing.T, rep *RebuildReport, object string, class SkipClass) {
	t.Helper()
	if !rep.Partial() {
		t.Fatalf("rebuild is complete, want it to skip %s", object)
	}
	for _, s := range rep.Skipped {
		if s.Name == object {
			if s.Class != class {
				t.Fatalf("skipped %s as %s (%s), want %s", object, s.Class, s.Error, class)
			}
			return
		}
	}
	t.Fatalf("rebuild skipped %+v, not %s", rep.Skipped, object)
}

// Each bad object of the table, put into a store beside two healthy
// sandboxes, is skipped and named with its class by a fresh home's rebuild,
// which restores both healthy sandboxes whole; --strict fails naming it and
// keeps the old catalog. On the code before, 26 of these 31 kinds failed
// the rebuild of the whole store, and 9 still did (or lost a healthy
// sandbox) with SkipCorrupt.
func TestRebuildSkipsEachBadObjectAndRestoresTheRest(t *testing.T) {
	ctx := context.Background()
	src := newEngine(t)
	hp := makeHealthyPair(t, src)
	for _, bc := range badObjects() {
		t.Run(bc.name, func(t *testing.T) {
			home, store := storeCopy(t, src)
			object, class, err := bc.put(ctx, store, hp)
			must(t, err)
			if strings.HasPrefix(bc.name, "pack-shadowing") {
				// Older than the real pack, so it is the copy tried first.
				old := time.Now().Add(-time.Hour)
				must(t, os.Chtimes(filepath.Join(home, "store", object), old, old))
			}
			e := openEngineOracle(t, home, false) // the store stays hostile
			_, err = e.Rebuilder().RebuildCatalogWith(ctx, RebuildOptions{Strict: true})
			named := filepath.Base(object)
			if bc.name == "head-naming-a-record-with-missing-trees" {
				named = delta.RecordPrefix // it fails on the record first
			}
			if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), named) {
				t.Fatalf("strict rebuild: %v, want ErrCorrupt naming %s", err, named)
			}
			if sbs, _ := e.ListSandboxes(ctx); len(sbs) != 0 {
				t.Fatalf("a failed strict rebuild replaced the catalog: %d sandboxes", len(sbs))
			}
			rep, err := e.Rebuilder().RebuildCatalog(ctx)
			must(t, err)
			wantSkipped(t, rep, object, class)
			if rep.Sandboxes != 2 {
				t.Fatalf("rebuild restored %d sandboxes, want the 2 healthy ones (skipped %+v)", rep.Sandboxes, rep.Skipped)
			}
			hp.checkRestored(t, e, false)
			checkAll(t, e) // refcounts equal a recount over what was indexed
		})
	}
}

// A few kinds of bad object at once in a real bucket: a fresh home's
// rebuild names every one and restores both healthy sandboxes, which it
// branches and reads back.
func TestRebuildFromABucketWithBadObjects(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	cfg := remoteCfg(srv.Endpoint, "badobjects")
	a := newEngine(t)
	_, err := a.HomeSetup().Init(ctx, cfg)
	must(t, err)
	hp := makeHealthyPair(t, a)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	want := map[string]SkipClass{}
	for _, bc := range badObjects() {
		switch bc.name {
		case "pack-truncated", "pack-raw-length-2^64-1", "record-bad-json", "record-naming-missing-trees",
			"record-tree-does-not-decode", "record-naming-another-sandboxs-key", "description-under-the-wrong-key",
			"head-malformed-owner-line", "head-dangling", "head-naming-a-record-with-missing-trees", "tag-dangling":
			object, class, err := bc.put(ctx, a.stores.remote, hp)
			must(t, err)
			want[object] = class
		}
	}
	d := newEngine(t)
	_, err = d.HomeSetup().Init(ctx, cfg)
	must(t, err)
	rep, err := d.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	for object, class := range want {
		wantSkipped(t, rep, object, class)
	}
	// The head naming a record with missing trees names that record too.
	if len(rep.Skipped) != len(want)+1 || rep.Sandboxes != 2 {
		t.Fatalf("rebuild: %d sandboxes, skipped %+v; want 2 and the %d bad objects (+1 record)", rep.Sandboxes, rep.Skipped, len(want))
	}
	hp.checkRestored(t, d, true)
	checkAll(t, d)
}

// Issue 23, item 1: a head on one home names a checkpoint that another
// home's prune deleted. A fresh home's rebuild used to fail whole (exit 3,
// "ref head/xc: target checkpoint ... not found", with --skip-corrupt too)
// and listed no sandbox at all. Now it restores every whole checkpoint and
// names the dangling head.
func TestRebuildAfterAPruneElsewhereLeftAHeadDangling(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	cfg := remoteCfg(srv.Endpoint, "dangling")
	a, b := newEngine(t), newEngine(t)
	_, err := a.HomeSetup().Init(ctx, cfg)
	must(t, err)
	cr := smallSandbox(t, a, "x")
	content := map[delta.ID]string{cr.Checkpoint.ID: ""}
	turn := func(i int) delta.ID {
		t.Helper()
		c := fmt.Sprintf("turn %d\n", i)
		write(t, filepath.Join(cr.Root, "turn.txt"), c)
		r, err := a.Checkpoint(ctx, "x", CheckpointOptions{})
		must(t, err)
		content[r.ID] = c
		return r.ID
	}
	var branched delta.ID
	for i := range 4 {
		branched = turn(i)
	}
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)

	// B learns x from the bucket, branches its head into xc and pushes.
	_, err = b.HomeSetup().Init(ctx, cfg)
	must(t, err)
	_, err = b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	_, err = b.Branch(ctx, mustRef(branched.String()), "xc", BranchOptions{})
	must(t, err)
	_, err = b.Remote().Push(ctx, PushOptions{})
	must(t, err)

	// A goes on, prunes to its last 2 and collects.
	for i := 4; i < 6; i++ {
		turn(i)
	}
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	_, err = a.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 2})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	_, err = a.Retention().GC(ctx, retention.GCOptions{Grace: -1})
	must(t, err)
	if remoteRecords(t, a)[branched.String()] {
		// A prune that keeps what other homes' heads name (being fixed
		// apart from this) leaves it: delete it as that prune did.
		must(t, a.stores.remote.Delete(ctx, delta.RecordName(branched)))
	}

	d := newEngine(t)
	_, err = d.HomeSetup().Init(ctx, cfg)
	must(t, err)
	_, err = d.Rebuilder().RebuildCatalogWith(ctx, RebuildOptions{Strict: true})
	if !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), branched.Short()) {
		t.Fatalf("strict rebuild: %v, want it to fail naming %s", err, branched.Short())
	}
	rep, err := d.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	var xcHead string
	for _, s := range rep.Skipped {
		if s.Sandbox == "xc" {
			xcHead = s.Name
		}
	}
	if !strings.HasPrefix(xcHead, delta.HeadPrefix) {
		t.Fatalf("rebuild skipped %+v, want xc's head among them", rep.Skipped)
	}
	wantSkipped(t, rep, xcHead, SkipDangling)
	if len(rep.Skipped) != 1 || rep.Sandboxes != 1 {
		t.Fatalf("rebuild: %d sandboxes, skipped %+v; want x, and xc's head", rep.Sandboxes, rep.Skipped)
	}
	// Every checkpoint of x the bucket still holds is restored: it
	// verifies, and a branch of it holds that turn's file.
	inBucket := remoteRecords(t, a)
	var restored []delta.ID
	for _, id := range checkpointsOf(t, d, "x") {
		restored = append(restored, id)
		if !inBucket[id.String()] {
			t.Fatalf("checkpoint %s restored, but the bucket lacks it", id.Short())
		}
	}
	if len(restored) != len(inBucket) || len(restored) < 2 {
		t.Fatalf("restored %d checkpoints of x, the bucket holds %d records", len(restored), len(inBucket))
	}
	for i, id := range restored {
		_, err := d.Verifier().Verify(ctx, mustRef(id.String()))
		must(t, err)
		br, err := d.Branch(ctx, mustRef(id.String()), delta.SandboxName(fmt.Sprintf("r%d", i)), BranchOptions{})
		must(t, err)
		got, err := os.ReadFile(filepath.Join(br.Root, "turn.txt"))
		if content[id] == "" {
			if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("branch of %s: turn.txt %q %v, want none", id.Short(), got, err)
			}
		} else if string(got) != content[id] {
			t.Fatalf("branch of %s: turn.txt %q %v, want %q", id.Short(), got, err, content[id])
		}
	}
	// x's log works; xc is not a sandbox here, and asking for it is
	// "not found", not a crash; the whole home's lineage lists x's.
	log, err := d.History().Log(ctx, "x")
	must(t, err)
	if len(log) != len(restored) {
		t.Fatalf("log x lists %d checkpoints, want %d", len(log), len(restored))
	}
	if _, err := d.History().Log(ctx, "xc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("log xc: %v, want not found", err)
	}
	if _, err := d.Branch(ctx, mustRef(branched.String()), "from-gone", BranchOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("branch of the pruned checkpoint: %v, want not found", err)
	}
	lin, err := d.History().Lineage(ctx, history.LineageOptions{})
	must(t, err)
	if len(lin.Checkpoints) != len(restored) {
		t.Fatalf("lineage lists %d checkpoints, want %d", len(lin.Checkpoints), len(restored))
	}
	checkAll(t, d)
}

// A sandbox whose head names a checkpoint whose trees are gone is skipped
// under its head, but its whole checkpoints are still indexed: the whole
// home's lineage lists them and they branch.
func TestRebuildKeepsWholeCheckpointsOfASkippedHead(t *testing.T) {
	ctx := context.Background()
	src := newEngine(t)
	cr := smallSandbox(t, src, "s")
	write(t, filepath.Join(cr.Root, "turn.txt"), "one\n")
	c1, err := src.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	head, err := src.Resolve(ctx, mustRef(c1.ID.String()))
	must(t, err)
	// On a copy of the store, the head moves to a record whose layer is in
	// no pack.
	home, store := storeCopy(t, src)
	bad := onTop(&healthyPair{heads: [2]*delta.Checkpoint{head}}, delta.Hash([]byte("lost layer")))
	rec, err := storeRecord(ctx, store, bad)
	must(t, err)
	badID, _ := delta.ParseID(strings.TrimPrefix(rec, delta.RecordPrefix))
	headObj := delta.HeadObject(delta.SandboxKey(cr.Sandbox.ID))
	must(t, upload.PutBytes(ctx, store, headObj, delta.EncodeRef(badID)))
	e := openEngineOracle(t, home, false)

	rep, err := e.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	wantSkipped(t, rep, rec, SkipMissingObjects)
	wantSkipped(t, rep, headObj, SkipMissingObjects)
	if rep.Sandboxes != 0 || rep.Checkpoints != 2 {
		t.Fatalf("rebuild: %d sandboxes, %d checkpoints; want 0, 2", rep.Sandboxes, rep.Checkpoints)
	}
	if _, err := e.History().Log(ctx, "s"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("log s: %v, want not found", err)
	}
	lin, err := e.History().Lineage(ctx, history.LineageOptions{})
	must(t, err)
	for _, id := range []delta.ID{cr.Checkpoint.ID, c1.ID} {
		if !slices.ContainsFunc(lin.Checkpoints, func(l history.LineageEntry) bool { return l.ID == id }) {
			t.Fatalf("lineage after the rebuild lacks %s: %+v", id.Short(), lin.Checkpoints)
		}
	}
	br, err := e.Branch(ctx, mustRef(c1.ID.String()), "again", BranchOptions{})
	must(t, err)
	if got, err := os.ReadFile(filepath.Join(br.Root, "turn.txt")); err != nil || string(got) != "one\n" {
		t.Fatalf("branch of the whole checkpoint: %q %v", got, err)
	}
	var n int
	must(t, e.view(ctx, func(tx *catalog.Tx) error {
		refs, err := tx.Refs(delta.RefHead)
		n = len(refs)
		return err
	}))
	if n != 1 || !slices.ContainsFunc(rep.Skipped, func(s SkippedObject) bool { return s.Sandbox == "s" }) {
		t.Fatalf("heads after the rebuild: %d (want the branch's only); skipped %+v", n, rep.Skipped)
	}

	// On the home that has s, the same store keeps s at this home's head:
	// the stored head is still reported, but s's root here is at c1.
	must(t, upload.PutBytes(ctx, src.stores.local, rec, mustRead(t, store, rec)))
	must(t, upload.PutBytes(ctx, src.stores.local, headObj, delta.EncodeRef(badID)))
	rep, err = src.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	wantSkipped(t, rep, headObj, SkipMissingObjects)
	if rep.Sandboxes != 1 {
		t.Fatalf("rebuild on s's home: %d sandboxes, want s", rep.Sandboxes)
	}
	sbs, err := src.ListSandboxes(ctx)
	must(t, err)
	if len(sbs) != 1 || sbs[0].Head == nil || sbs[0].Head.ID != c1.ID {
		t.Fatalf("s after the rebuild on its home: %+v, want its head %s", sbs, c1.ID.Short())
	}
	// The store is made whole again for the final oracle.
	must(t, src.stores.local.Delete(ctx, rec))
	must(t, upload.PutBytes(ctx, src.stores.local, headObj, delta.EncodeRef(c1.ID)))
}

func mustRead(t *testing.T, s upload.Store, name string) []byte {
	t.Helper()
	data, err := upload.ReadAll(context.Background(), s, name)
	must(t, err)
	return data
}
