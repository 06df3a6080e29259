package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/hostile"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/upload"
)

// Hostile objects written into a real home's store exit 7 (corrupt data)
// from every command that meets them, naming what is wrong; none panics.
func TestCLIHostileStoreExitsCorrupt(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s"); run(t, home, "sandbox", "rm", "b") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	os.WriteFile(filepath.Join(created.Root, "b.txt"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")
	e, err := engine.Open(ctx, engine.Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	parent, err := e.Resolve(ctx, mustRef(c1.ID))
	e.Close()
	if err != nil {
		t.Fatal(err)
	}
	store, err := upload.NewLocal(filepath.Join(home, "store"))
	if err != nil {
		t.Fatal(err)
	}
	expect := func(want int, fragment string, args ...string) {
		t.Helper()
		out, code := run(t, home, args...)
		if code != want || !strings.Contains(out, fragment) {
			t.Errorf("turnsnap %v: exit %d, want %d naming %q: %s", args, code, want, fragment, out)
		}
	}
	cases, err := hostile.Cases(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		pack, err := hostile.WritePack(ctx, store, c.Blobs)
		if err != nil {
			t.Fatal(err)
		}
		id, err := hostile.WriteRecord(ctx, store, parent, c.Root)
		if err != nil {
			t.Fatal(err)
		}
		expect(0, "catalog rebuilt", "catalog", "rebuild")
		expect(exitCorrupt, c.Want, "verify", id.String())
		expect(exitCorrupt, c.Want, "verify", "--store-only")
		expect(exitCorrupt, c.Want, "rollback", "s", id.String())
		expect(exitCorrupt, c.Want, "branch", id.String(), "b")
		store.Delete(ctx, pack)
		store.Delete(ctx, "records/"+id.String())
		expect(0, "catalog rebuilt", "catalog", "rebuild")
	}
	for _, blobs := range hostile.LyingHeaders() {
		pack, err := hostile.WritePack(ctx, store, blobs)
		if err != nil {
			t.Fatal(err)
		}
		expect(exitPartial, pack, "catalog", "rebuild")
		expect(exitCorrupt, pack, "catalog", "rebuild", "--strict")
		expect(exitCorrupt, pack, "verify", "--store-only")
		store.Delete(ctx, pack)
	}
	expect(0, "store ok", "verify", "--store-only")
	expect(0, "ok", "verify", c1.ID)
}
