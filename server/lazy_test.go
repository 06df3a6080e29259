package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/api"
)

// A lazy branch over the daemon's API: "lazy": true makes the sandbox with
// placeholders that the daemon fills on first access; a file read through
// the root returns its bytes, and the branch's first checkpoint (which
// waits for the restore to be whole) records the checkpoint's own state.
// More than one name is refused.
func TestLazyBranchOverTheAPI(t *testing.T) {
	f := serve(t, nil)
	ctx := context.Background()
	root := f.create(t, "src")
	if err := os.WriteFile(filepath.Join(root, "conf.txt"), []byte("lazy over the wire\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := f.c.Checkpoint(ctx, "src", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := f.c.Branch(ctx, string(cp.ID), api.BranchRequest{Name: "lz", Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Receipt != nil {
		t.Errorf("a lazy branch came back with a receipt: %+v", rs[0].Receipt)
	}
	// The checkpoint says what a branch needs to know to choose a lazy
	// restore: an overlay root, no processes.
	if e, err := f.c.GetCheckpoint(ctx, string(cp.ID)); err != nil || e.Backend != "overlay" || e.Processes {
		t.Fatalf("checkpoint %s: backend %q processes %v (%v); want overlay, none", cp.ID.Short(), e.Backend, e.Processes, err)
	}
	got, err := os.ReadFile(filepath.Join(rs[0].Root, "conf.txt"))
	if err != nil || string(got) != "lazy over the wire\n" {
		t.Fatalf("read through the lazy root: %q %v", got, err)
	}
	// Its progress is the sandbox's: conf.txt was filled by this read at
	// the latest; the source has no lazy restore.
	sb, err := f.c.GetSandbox(ctx, "lz")
	if err != nil || sb.Lazy == nil || sb.Lazy.Filled < 1 || sb.Lazy.Error != "" {
		t.Fatalf("lazy branch's progress: %+v %v; want at least one file filled", sb, err)
	}
	if src, err := f.c.GetSandbox(ctx, "src"); err != nil || src.Lazy != nil {
		t.Fatalf("the source sandbox reports a lazy restore: %+v %v", src, err)
	}
	c2, err := f.c.Checkpoint(ctx, "lz", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c2.Class != "skip" {
		t.Fatalf("first checkpoint of the lazy branch: %s, want skip", c2.Class)
	}
	// The checkpoint waited for the restore: it is whole now.
	if sb, err := f.c.GetSandbox(ctx, "lz"); err != nil || sb.Lazy == nil || !sb.Lazy.Whole || sb.Lazy.Pending != 0 {
		t.Fatalf("lazy branch after its first checkpoint: %+v %v; want whole", sb.Lazy, err)
	}
	if _, err := f.c.Branch(ctx, string(cp.ID), api.BranchRequest{Name: "lz2", Count: 2, Lazy: true}); err == nil || !strings.Contains(err.Error(), "one sandbox") {
		t.Fatalf("lazy fan-out: %v, want refused", err)
	}
}
