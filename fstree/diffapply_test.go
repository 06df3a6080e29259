package fstree

import (
	"context"
	"errors"
	"github.com/turnsnap/turnsnap/delta"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

func inodeOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st.Ino
}

// applyDiff turns dir from live into target (plan, apply, verify, sync).
func applyDiff(t *testing.T, dir string, live, target delta.ID, mem *memBlobs) *DiffResult {
	t.Helper()
	res, err := ApplyDiff(context.Background(), dir, live, target, DiffOptions{Loader: mem, Live: mem, Translate: overlayish})
	must(t, err)
	return res
}

// A diff turns one state into the other in both directions, touching only
// the names that differ, and files in both states keep their inodes.
func TestApplyDiffBothWays(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	buildRich(t, dir)
	mem := newMem()
	scan := func() *ScanResult {
		t.Helper()
		r, err := Scan(ctx, dir, ScanOptions{Saver: mem, Translate: overlayish})
		must(t, err)
		return r
	}
	a := scan()
	p := func(rel string) string { return filepath.Join(dir, rel) }
	keep := map[string]uint64{"empty": inodeOf(t, p("empty")), "setuid": inodeOf(t, p("setuid")), "src/pkg": inodeOf(t, p("src/pkg")), "opq": inodeOf(t, p("opq"))}
	must(t, os.WriteFile(p("empty"), []byte("no longer empty\n"), 0o640)) // in place
	must(t, unix.Chmod(p("setuid"), 0o700))                               // metadata only
	must(t, os.Remove(p("fifo")))
	must(t, os.MkdirAll(p("fifo/now/a/dir"), 0o755)) // kind changed
	must(t, os.WriteFile(p("fifo/now/a/dir/f"), []byte("deep"), 0o644))
	must(t, unix.Removexattr(p("opq"), OpaqueXattr)) // no longer opaque
	must(t, os.Remove(p("src/escape")))
	must(t, os.Symlink("elsewhere", p("src/escape")))
	must(t, os.Remove(p("src/pkg/big.bin")))
	must(t, os.WriteFile(p("src/pkg/new.txt"), []byte("new"), 0o600))
	must(t, unix.Mknod(p("src/gone2"), unix.S_IFCHR, 0)) // a whiteout more
	b := scan()
	for _, step := range []struct {
		name     string
		from, to *ScanResult
	}{{"b->a", b, a}, {"a->b", a, b}, {"b->a again", b, a}} {
		res := applyDiff(t, dir, step.from.Root, step.to.Root, mem)
		if got := scan(); got.Root != step.to.Root {
			t.Fatalf("%s: dir hashes to %s, want %s", step.name, got.Root.Short(), step.to.Root.Short())
		}
		for rel, ino := range keep {
			if got := inodeOf(t, p(rel)); got != ino {
				t.Errorf("%s: %s has inode %d, had %d", step.name, rel, got, ino)
			}
		}
		if len(res.Written) > 12 {
			t.Errorf("%s: wrote %d names for a diff of about ten: %v", step.name, len(res.Written), res.Written)
		}
	}
	// Nothing to do between equal states.
	plan, err := PlanDiff(ctx, dir, a.Root, a.Root, DiffOptions{Loader: mem, Live: mem})
	must(t, err)
	if !plan.Empty() {
		t.Fatalf("equal states planned %d changes", plan.Changes())
	}
}

// Everything that can fail is found by the plan, before any write: a
// corrupt chunk, a diff over the memory bound, a changed multiply-linked
// file. A name swapped for a symlink between plan and apply is refused,
// and the symlink's target is untouched.
func TestApplyDiffRefusesBeforeWriting(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	buildRich(t, dir)
	mem := newMem()
	a, err := Scan(ctx, dir, ScanOptions{Saver: mem, Translate: overlayish})
	must(t, err)
	p := func(rel string) string { return filepath.Join(dir, rel) }
	must(t, os.WriteFile(p("empty"), []byte("changed\n"), 0o640))
	must(t, os.WriteFile(p("extra"), []byte("extra\n"), 0o640))
	b, err := Scan(ctx, dir, ScanOptions{Saver: mem, Translate: overlayish})
	must(t, err)

	// Swapped for a symlink after the plan: the rewrite refuses it.
	plan, err := PlanDiff(ctx, dir, b.Root, a.Root, DiffOptions{Loader: mem, Live: mem, Translate: overlayish})
	must(t, err)
	outside := filepath.Join(t.TempDir(), "host-file")
	must(t, os.WriteFile(outside, []byte("host"), 0o600))
	must(t, os.Remove(p("empty")))
	must(t, os.Symlink(outside, p("empty")))
	if _, err := plan.Apply(ctx); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("rewrite through a swapped-in symlink: %v, want ErrPrecondition", err)
	}
	if data, _ := os.ReadFile(outside); string(data) != "host" {
		t.Fatalf("the symlink's target was written: %q", data)
	}
	must(t, os.Remove(p("empty")))
	must(t, os.WriteFile(p("empty"), []byte("changed\n"), 0o640))

	// The plan needs big.bin's chunks back (b has it removed below).
	must(t, os.Remove(p("src/pkg/big.bin")))
	c, err := Scan(ctx, dir, ScanOptions{Saver: mem, Translate: overlayish})
	must(t, err)
	_, err = PlanDiff(ctx, dir, c.Root, b.Root, DiffOptions{Loader: mem, Live: mem, MaxBytes: 1 << 20})
	if !errors.Is(err, ErrDiffUnsupported) {
		t.Fatalf("a diff over the memory bound: %v, want ErrDiffUnsupported", err)
	}
	for id, data := range mem.m {
		if len(data) > 4096 { // big.bin's chunks: every other blob is small
			corrupt := append([]byte(nil), data...)
			corrupt[0] ^= 1
			mem.m[id] = corrupt
		}
	}
	_, err = PlanDiff(ctx, dir, c.Root, b.Root, DiffOptions{Loader: mem, Live: mem})
	if !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("a diff needing a corrupt chunk: %v, want ErrCorrupt", err)
	}
	if got, _ := Scan(ctx, dir, ScanOptions{Translate: overlayish}); got.Root != c.Root {
		t.Fatal("a refused plan changed the directory")
	}

	// src/main.go has a second name (zlink).
	must(t, os.WriteFile(p("src/main.go"), []byte("package main // edited\n"), 0o644))
	d, err := Scan(ctx, dir, ScanOptions{Saver: mem, Translate: overlayish})
	must(t, err)
	_, err = PlanDiff(ctx, dir, d.Root, a.Root, DiffOptions{Loader: mem, Live: mem, Translate: overlayish})
	if !errors.Is(err, ErrDiffUnsupported) {
		t.Fatalf("a diff changing a hardlinked file: %v, want ErrDiffUnsupported", err)
	}

}
