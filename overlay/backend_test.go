package overlay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// TestCheckBaseRefusesDamage: a restore's base check (not full) passes an
// untouched materialised base without scanning it into trees, and still
// refuses one changed on disk in any way a scan records: content
// rewritten in place with its mtime put back, a name added to or removed
// from a directory, a directory's mode.
func TestCheckBaseRefusesDamage(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	old := time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{"etc/conf", "usr/lib/x/lib.so", "usr/bin/tool", "README"} {
		roottest.Write(t, filepath.Join(src, p), "content of "+p+"\n")
		must(t, os.Chtimes(filepath.Join(src, p), old, old))
	}
	store := roottest.NewMemStore()
	res, err := fstree.Scan(ctx, src, fstree.ScanOptions{Saver: store, Quiescent: true})
	must(t, err)
	b := NewBackend(filepath.Join(t.TempDir(), "bases"))
	for _, tc := range []struct {
		name   string
		damage func(base string) error
	}{
		{"content rewritten, mtime put back", func(base string) error {
			p := filepath.Join(base, "usr/lib/x/lib.so")
			if err := os.WriteFile(p, []byte("CONTENT OF usr/lib/x/lib.so\n"), 0o644); err != nil {
				return err
			}
			return os.Chtimes(p, old, old)
		}},
		{"a name added", func(base string) error { return os.WriteFile(filepath.Join(base, "usr/lib/x/evil.so"), nil, 0o644) }},
		{"a name removed", func(base string) error { return os.Remove(filepath.Join(base, "README")) }},
		{"a directory's mode", func(base string) error { return os.Chmod(filepath.Join(base, "etc"), 0o777) }},
	} {
		base, err := b.PrepareBase(ctx, res.Root, store)
		must(t, err)
		for range 2 { // the second from the memo's cache
			if ok, err := b.CheckBase(ctx, res.Root, false); !ok || err != nil {
				t.Fatalf("%s: an untouched base checks as %v, %v", tc.name, ok, err)
			}
		}
		must(t, tc.damage(base))
		for _, full := range []bool{false, true} {
			if _, err := b.CheckBase(ctx, res.Root, full); !errors.Is(err, errdefs.ErrCorrupt) {
				t.Errorf("%s (full=%v): the damaged base checks as %v, want ErrCorrupt", tc.name, full, err)
			}
		}
		must(t, os.RemoveAll(base)) // the next case materialises it again
	}
}

// TestCheckBaseTrustsACleanWatch: the first restore's check of a base
// walks it (and arms a watch first); the next ones answer from the clean
// watch without a walk; a change below the base makes the next check walk
// again, and refuse the damage; a watch older than baseTrust is dropped.
func TestCheckBaseTrustsACleanWatch(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	for _, p := range []string{"etc/conf", "usr/lib/x/lib.so", "README"} {
		roottest.Write(t, filepath.Join(src, p), "content of "+p+"\n")
	}
	store := roottest.NewMemStore()
	res, err := fstree.Scan(ctx, src, fstree.ScanOptions{Saver: store, Quiescent: true})
	must(t, err)
	b := NewBackend(filepath.Join(t.TempDir(), "bases"))
	defer b.Close()
	base, err := b.PrepareBase(ctx, res.Root, store)
	must(t, err)
	for range 3 {
		if ok, err := b.CheckBase(ctx, res.Root, false); !ok || err != nil {
			t.Fatalf("an untouched base checks as %v, %v", ok, err)
		}
	}
	if st := b.BaseCheckStats(); st != (BaseCheckStats{Walked: 1, Trusted: 2}) {
		t.Fatalf("three checks of an untouched base: %+v, want 1 walk and 2 answers from the watch", st)
	}
	// A full check (verify) always reads everything.
	if ok, err := b.CheckBase(ctx, res.Root, true); !ok || err != nil {
		t.Fatalf("full check: %v, %v", ok, err)
	}
	if st := b.BaseCheckStats(); st.Trusted != 2 {
		t.Fatalf("a full check was answered from the watch: %+v", st)
	}
	// Too old: dropped, and the next check walks.
	if b.watches.clean(res.Root, time.Now().Add(baseTrust+time.Second)) {
		t.Fatal("a watch older than baseTrust was trusted")
	}
	if _, err := b.CheckBase(ctx, res.Root, false); err != nil {
		t.Fatal(err)
	}
	if st := b.BaseCheckStats(); st.Walked != 2 {
		t.Fatalf("after an old watch: %+v, want a second walk", st)
	}
	// Damage below the base: walked again and refused.
	must(t, os.WriteFile(filepath.Join(base, "usr/lib/x/lib.so"), []byte("CONTENT OF usr/lib/x/lib.so\n"), 0o644))
	if _, err := b.CheckBase(ctx, res.Root, false); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("the damaged base checks as %v, want ErrCorrupt", err)
	}
	if _, err := b.CheckBase(ctx, res.Root, false); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("the damaged base, checked again: %v, want ErrCorrupt (no watch kept after a failed check)", err)
	}
	if st := b.BaseCheckStats(); st.Walked != 4 || st.Trusted != 2 {
		t.Fatalf("after damage: %+v, want every check walking", st)
	}
}
