package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// noBlobs is a blob reader with no blobs at all.
type noBlobs struct{}

func (noBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	return nil, errdefs.ErrNotFound
}

func (noBlobs) LoaderFor(map[delta.ID]catalog.BlobLocation) delta.BlobLoader { return noBlobs{} }

// testRebuilder rebuilds the catalog of a home whose store is store.
func testRebuilder(t *testing.T, store upload.Store) (*Rebuilder, func() *catalog.Catalog) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "catalog")
	cat, err := catalog.Open(ctx, dir, catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cat != nil {
			cat.Close()
		}
	})
	r := New(Deps{
		CatalogDir:        dir,
		Exclusive:         func() func() { return func() {} },
		Phase:             func(string) {},
		RefuseIfEncrypted: func(context.Context) error { return nil },
		CatalogOptions:    func() catalog.Options { return catalog.Options{} },
		Catalog:           func() *catalog.Catalog { return cat },
		SetCatalog:        func(c *catalog.Catalog) { cat = c },
		Stores:            func() (upload.Store, upload.Store, upload.Store) { return store, store, nil },
		Keys:              func() *delta.Keys { return nil },
		Blobs:             func() Locations { return noBlobs{} },
		BlobsOf:           func(*catalog.Catalog) delta.BlobLoader { return noBlobs{} },
		Syncer:            func() *remote.Syncer { return &remote.Syncer{} },
		HomeID:            func() string { return "" },
		Log:               slog.Default(),
	})
	return r, func() *catalog.Catalog { return cat }
}

// A store whose one checkpoint's trees are in no pack: the rebuild leaves
// out the record, the head naming it and a tag naming a record the store
// lacks, each with its class, and swaps in a catalog of what was whole;
// Strict refuses at the first and keeps the old catalog.
func TestRebuildSkipsWhatIsNotWhole(t *testing.T) {
	ctx := context.Background()
	store, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sb := &delta.Sandbox{ID: delta.NewSandboxID(), Home: delta.NewSandboxID(), Name: "s", Backend: "overlay",
		BaseTree: delta.Hash([]byte("base")), Created: time.Unix(1, 0).UTC()}
	cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: "s", SandboxID: sb.ID, Turn: 1, Class: delta.ClassFS,
		Backend: "overlay", BaseTree: sb.BaseTree, FSTree: delta.Hash([]byte("fs")), Created: time.Unix(2, 0).UTC()}
	data, id, err := delta.EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	desc, _ := json.Marshal(sb)
	gone := delta.Hash([]byte("pruned elsewhere"))
	for name, data := range map[string][]byte{
		delta.RecordName(id):                       data,
		delta.SandboxObject(sb.Key()):              desc,
		delta.HeadObject(sb.Key()):                 delta.EncodeRef(id),
		delta.RefName(delta.RefTag, "dangling"):    delta.EncodeRef(gone),
		delta.RecordPrefix + "not-a-record-at-all": []byte("x"),
	} {
		if err := upload.PutBytes(ctx, store, name, data); err != nil {
			t.Fatal(err)
		}
	}
	r, live := testRebuilder(t, store)
	old := live()

	if _, err := r.RebuildCatalogWith(ctx, Options{Strict: true}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("strict rebuild of a store with a record that is not whole: %v", err)
	}
	if live() != old {
		t.Fatal("a failed rebuild replaced the catalog")
	}

	rep, err := r.RebuildCatalog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if live() == old || live() == nil {
		t.Fatal("the rebuilt catalog is not the live one")
	}
	got := map[string]SkipClass{}
	for _, s := range rep.Skipped {
		got[s.Name] = s.Class
	}
	want := map[string]SkipClass{
		delta.RecordName(id):                    SkipMissingObjects,
		delta.HeadObject(sb.Key()):              SkipMissingObjects,
		delta.RefName(delta.RefTag, "dangling"): SkipDangling,
	}
	if len(got) != len(want) || !rep.Partial() || rep.Checkpoints != 0 || rep.Sandboxes != 0 {
		t.Fatalf("rebuild report %+v", rep)
	}
	for name, class := range want {
		if got[name] != class {
			t.Errorf("%s skipped as %q, want %q", name, got[name], class)
		}
	}
	if !slices.IsSortedFunc(rep.Skipped, func(a, b SkippedObject) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("skipped objects not sorted by name")
	}
}

// Finish swaps only a rebuilt catalog marked complete; an unmarked one is
// discarded and the live catalog kept.
func TestFinishSwapsOnlyACompleteRebuild(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "catalog")
	write := func(path, s string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "f"))
		return string(b)
	}
	write(filepath.Join(dir, "f"), "live")
	write(filepath.Join(Dir(dir), "f"), "half built")
	if err := Finish(dir); err != nil {
		t.Fatal(err)
	}
	if read() != "live" {
		t.Fatalf("an unfinished rebuild replaced the catalog: %q", read())
	}
	if _, err := os.Stat(Dir(dir)); !os.IsNotExist(err) {
		t.Fatalf("an unfinished rebuild was left: %v", err)
	}
	write(filepath.Join(Dir(dir), "f"), "rebuilt")
	write(filepath.Join(Dir(dir), rebuildMarker), "")
	if err := Finish(dir); err != nil {
		t.Fatal(err)
	}
	if read() != "rebuilt" {
		t.Fatalf("a complete rebuild was not swapped in: %q", read())
	}
	for _, p := range []string{filepath.Join(dir, rebuildMarker), Dir(dir), retiredDir(dir)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after the swap: %v", p, err)
		}
	}
}
