package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A sandbox rm killed at any point leaves a state a second sandbox rm
// completes: here the states it passes through, made by hand.
func TestSandboxRmCompletesAKilledRm(t *testing.T) {
	ctx := context.Background()
	for _, phase := range []string{"unmounted", "root-dir-gone", "half-deleted", "dir-gone", "objects-gone"} {
		t.Run(phase, func(t *testing.T) {
			e, cr, _ := hostileHome(t, true)
			dir := e.home.sandboxDir("s")
			must(t, unix.Unmount(cr.Root, 0))
			switch phase {
			case "root-dir-gone":
				must(t, os.Remove(cr.Root))
			case "half-deleted":
				must(t, os.Remove(cr.Root))
				must(t, os.Remove(filepath.Join(dir, "current")))
			case "dir-gone":
				must(t, os.RemoveAll(dir))
			case "objects-gone":
				must(t, os.RemoveAll(dir))
				must(t, e.stores.local.Delete(ctx, "refs/heads/s"))
				must(t, e.stores.local.Delete(ctx, "sandboxes/s"))
			}
			if err := e.RemoveSandbox(ctx, "s"); err != nil {
				t.Fatalf("second sandbox rm after a kill (%s): %v", phase, err)
			}
			if sbs, _ := e.ListSandboxes(ctx); len(sbs) != 0 {
				t.Fatalf("sandbox still listed: %+v", sbs)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("sandbox dir still there: %v", err)
			}
			if _, err := e.Rebuilder().RebuildCatalog(ctx); err != nil {
				t.Fatal(err)
			}
			if sbs, _ := e.ListSandboxes(ctx); len(sbs) != 0 {
				t.Fatalf("removed sandbox back after rebuild: %+v", sbs)
			}
		})
	}
}

// A sandbox removed while its removal is still queued for the bucket does
// not come back from the bucket at a catalog rebuild, and the removal still
// reaches the bucket afterwards.
func TestRemovedSandboxStaysRemovedAcrossRebuild(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	e, _, _ := hostileHome(t, true)
	_, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "rmrebuild"))
	must(t, err)
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err)
	must(t, e.RemoveSandbox(ctx, "s"))
	_, err = e.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if sbs, _ := e.ListSandboxes(ctx); len(sbs) != 0 {
		t.Fatalf("removed sandbox came back from the bucket: %+v", sbs)
	}
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err)
	for _, name := range []string{"sandboxes/s", "refs/heads/s"} {
		if _, err := e.stores.remote.Stat(ctx, name); err == nil {
			t.Errorf("%s still in the bucket after the queued removal was pushed", name)
		}
	}
}
