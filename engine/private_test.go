package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// memoryIn walks root and returns the regular files holding marker,
// with their modes, among those changed since since (zero: all) and
// smaller than 256 MiB. skip is left out.
func memoryIn(t *testing.T, root, skip string, marker []byte, since time.Time) map[string]fs.FileMode {
	t.Helper()
	found := map[string]fs.FileMode{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file another test removed meanwhile
		}
		if skip != "" && p == skip {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil || fi.ModTime().Before(since) || fi.Size() > 256<<20 {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, marker) {
			found[p] = fi.Mode().Perm()
		}
		return nil
	})
	return found
}

// privateTree fails unless every directory under dir is 0700 and every
// file has no group or other permission.
func privateTree(t *testing.T, what, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if d.IsDir() && fi.Mode().Perm() != 0o700 || d.Type().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %s is %v", what, p, fi.Mode().Perm())
		}
		return nil
	})
}

// noneLeft fails unless dir holds nothing (or does not exist).
func noneLeft(t *testing.T, what, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("%s: %s left in %s", what, e.Name(), dir)
	}
}

// TestProcessMemoryStaysPrivate keeps a secret in a sandbox process's
// memory only (a shell variable built at run time, so no command line or
// file holds it) and follows it through a checkpoint, a rollback and a
// branch: the dump's image holds it, in 0600 files under 0700 directories;
// so does the image a restore reads back from the store; both are gone
// when their operation ends, as are CRIU's work directories; and at the
// end no world- or group-readable file under the home, the process state
// root or /tmp holds it, and nothing outside the home under /tmp does.
func TestProcessMemoryStaysPrivate(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	start := time.Now().Add(-time.Second)
	e := newEngine(t)
	_, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	tag := make([]byte, 12)
	rand.Read(tag)
	marker := []byte("tsmark-" + hex.EncodeToString(tag))
	script := fmt.Sprintf(`secret=$(printf 'tsmark-%%s' %s); while :; do sleep 1; done`, hex.EncodeToString(tag))
	_, err = e.Processes().Exec(ctx, "s", []string{"sh", "-c", script}, ExecOptions{Detach: true})
	must(t, err)
	time.Sleep(300 * time.Millisecond)

	work, state := e.procs.WorkDir(), e.procs.StateRoot()
	dumped := false
	e.opts.AtPhase = func(p string) {
		if p != PhaseDump {
			return
		}
		privateTree(t, "the dump's image", work)
		dumped = len(memoryIn(t, work, "", marker, time.Time{})) > 0
	}
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	e.opts.AtPhase = nil
	if !dumped {
		t.Fatalf("the marker is in no file of the dump's image (class %s): the test cannot see process memory", c.Class)
	}
	noneLeft(t, "after the checkpoint", work)
	noneLeft(t, "after the checkpoint", filepath.Join(state, "work"))

	// The image a restore reads back from the store.
	cp, err := e.Resolve(ctx, mustRef(c.ID.String()))
	must(t, err)
	img, done, err := e.procs.Image(ctx, cp)
	must(t, err)
	privateTree(t, "the image read back", work)
	if len(memoryIn(t, img, "", marker, time.Time{})) == 0 {
		t.Error("the image read back from the store does not hold the marker")
	}
	done()
	noneLeft(t, "after reading an image back", work)

	_, err = e.Rollback(ctx, "s", mustRef(c.ID.String()), RollbackOptions{})
	must(t, err)
	r, err := e.Branch(ctx, mustRef(c.ID.String()), "b", BranchOptions{})
	must(t, err)
	if !r.Processes {
		t.Fatal("the branch did not restore processes")
	}
	noneLeft(t, "after a rollback and a branch", work)
	noneLeft(t, "after a rollback and a branch", filepath.Join(state, "work"))
	// The state root is 0700; inside it turnsnap's own directories are
	// private throughout (runc's container dirs are 0711 with a 0600
	// state.json, and a pinned network namespace reads 0444: neither
	// holds memory).
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the process state root %s: %v, %v", state, fi.Mode(), err)
	}
	privateTree(t, "the state root's work dirs", filepath.Join(state, "work"))
	privateTree(t, "the state root's bundles", filepath.Join(state, "bundles"))
	privateTree(t, "the home's proc dir", e.procs.Dir())
	privateTree(t, "the store", e.home.storeDir())

	home := e.Home()
	for _, root := range []string{home, state} {
		for p, mode := range memoryIn(t, root, "", marker, time.Time{}) {
			t.Logf("holds the marker: %s (%v)", p, mode)
			if mode&0o077 != 0 {
				t.Errorf("%s holds process memory and is %v", p, mode)
			}
		}
	}
	for p := range memoryIn(t, os.TempDir(), home, marker, start) {
		if !strings.HasPrefix(p, home+"/") {
			t.Errorf("%s, outside the home, holds process memory", p)
		}
	}
}
