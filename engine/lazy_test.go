package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"golang.org/x/sys/unix"
)

// TestLazyBranchFromTheBucket: a fresh home (catalog rebuilt from a real
// MinIO bucket) branches a checkpoint lazily. The root is mounted before
// the layer's data packs are fetched; a file read through it returns the
// checkpoint's bytes; the restore completes in the background; the root
// then hashes to the checkpoint's state, and the branch's first checkpoint
// records exactly that state (a skip). A second lazy branch, stopped by
// the engine's close midway, is finished by the next engine that loads it.
func TestLazyBranchFromTheBucket(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	a := newEngine(t)
	cr, err := a.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	big := make([]byte, 6<<20)
	_, _ = rand.Read(big)
	must(t, os.MkdirAll(filepath.Join(cr.Root, "data"), 0o755))
	for _, n := range []string{"a.bin", "b.bin", "c.bin"} {
		must(t, os.WriteFile(filepath.Join(cr.Root, "data", n), big, 0o644))
		big[0]++
	}
	write(t, filepath.Join(cr.Root, "app.conf"), "port = 8080\n")
	c1, err := a.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	want := mergedState(t, cr.Root)
	_, err = a.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "lazy"))
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)

	bHome := filepath.Join(t.TempDir(), "home")
	b := openEngine(t, bHome)
	_, err = b.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "lazy"))
	must(t, err)
	_, err = b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	before := countObjects(t, b.stores.local)
	br, err := b.BranchLazy(ctx, mustRef(c1.ID.String()), "lazy", BranchOptions{})
	must(t, err)
	got, err := os.ReadFile(filepath.Join(br.Root, "app.conf"))
	must(t, err)
	if string(got) != "port = 8080\n" {
		t.Fatalf("first read through the lazy root: %q", got)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	must(t, b.Lazy().Wait(wctx, "lazy"))
	after := countObjects(t, b.stores.local)
	if after <= before {
		t.Fatalf("local objects %d before the branch, %d after it completed: nothing fetched?", before, after)
	}
	for _, n := range []string{"a.bin", "b.bin", "c.bin"} {
		x, err := os.ReadFile(filepath.Join(br.Root, "data", n))
		must(t, err)
		y, err := os.ReadFile(filepath.Join(cr.Root, "data", n))
		must(t, err)
		if !bytes.Equal(x, y) {
			t.Fatalf("/data/%s after the lazy restore: not the checkpoint's bytes", n)
		}
	}
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("lazy branch hashes to %s, want %s", got.Short(), want.Short())
	}
	c2, err := b.Checkpoint(ctx, "lazy", CheckpointOptions{})
	must(t, err)
	if c2.Class != delta.ClassSkip {
		t.Fatalf("first checkpoint of a whole lazy branch: class %v, want skip", c2.Class)
	}

	// A second branch, its engine closed at once: the next engine resumes
	// the restore when the sandbox is loaded.
	br2, err := b.BranchLazy(ctx, mustRef(c1.ID.String()), "lazy2", BranchOptions{})
	must(t, err)
	st := b.Lazy().Status("lazy2")
	must(t, b.Close())
	b2 := openEngine(t, bHome)
	c3, err := b2.Checkpoint(ctx, "lazy2", CheckpointOptions{}) // waits for the restore
	must(t, err)
	if c3.Class != delta.ClassSkip {
		t.Fatalf("checkpoint after a resumed lazy restore: class %v, want skip", c3.Class)
	}
	if got := mergedState(t, br2.Root); got != want {
		t.Fatalf("resumed lazy branch hashes to %s, want %s", got.Short(), want.Short())
	}
	t.Logf("second branch: %d files pending when its engine closed", st.Pending)
}

// TestLazyBranchMissingPackNamesItAndTheSandbox: the bucket loses the data
// packs after a lazy branch started. A read of a file whose chunks were in
// them fails (EIO, never the placeholder's holes), and the restore's error
// names the sandbox and the missing pack; the sandbox is not whole, so its
// checkpoint is refused rather than recording placeholders.
func TestLazyBranchMissingPackNamesItAndTheSandbox(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	a := newEngine(t)
	cr, err := a.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	must(t, os.WriteFile(filepath.Join(cr.Root, "big.bin"), big, 0o644))
	c1, err := a.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	_, err = a.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "lazymiss"))
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)

	b := openEngineOracle(t, filepath.Join(t.TempDir(), "home"), false) // its bucket is damaged on purpose
	_, err = b.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "lazymiss"))
	must(t, err)
	_, err = b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	// The pack holding big.bin's first chunk goes before the branch (the
	// branch's fetch-ahead would otherwise race the deletion).
	cp1, err := b.Resolve(ctx, mustRef(c1.ID.String()))
	must(t, err)
	tr, err := delta.LoadTree(ctx, b.data.repo, cp1.FSTree)
	must(t, err)
	var chunk delta.ID
	for _, en := range tr.Entries {
		if en.Name == "big.bin" {
			chunk = en.Chunks[0]
		}
	}
	var loc catalog.BlobLocation
	must(t, b.view(ctx, func(tx *catalog.Tx) error {
		var found bool
		var err error
		if loc, found, err = tx.Blob(chunk); err == nil && !found {
			err = errors.New("big.bin's chunk is in no pack")
		}
		return err
	}))
	gone := delta.PackName(loc.Pack)
	must(t, b.stores.remote.Delete(ctx, gone))
	br, err := b.BranchLazy(ctx, mustRef(c1.ID.String()), "lz", BranchOptions{})
	must(t, err)
	_, err = os.ReadFile(filepath.Join(br.Root, "big.bin"))
	if !errors.Is(err, unix.EIO) {
		t.Fatalf("read of a file whose pack is gone: %v, want EIO", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	werr := b.Lazy().Wait(wctx, "lz")
	if werr == nil || !strings.Contains(werr.Error(), "sandbox lz") || !strings.Contains(werr.Error(), gone) {
		t.Fatalf("lazy restore with a data pack gone: %v; want the sandbox and %s named", werr, gone)
	}
	if _, err := b.Checkpoint(ctx, "lz", CheckpointOptions{}); err == nil {
		t.Fatal("a checkpoint of a lazy branch that is not whole succeeded")
	}
	t.Logf("error: %v", werr)
}
