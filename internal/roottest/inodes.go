package roottest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// testRollbackKeepsInodes: a restore to an earlier state keeps the inode
// number of every file that exists in both states, as seen in the root, so
// a process that remembers inode numbers (SQLite compares them on every
// write) survives its files being rolled back. Overlay rewrites such files
// in place; btrfs snapshots a restore point. It also rolls a base file
// that was copied up and then deleted back to the base's version, which
// overlay's index would otherwise make unreadable.
func testRollbackKeepsInodes(t *testing.T, s Setup) {
	f := newFixture(t, s)
	r, _ := f.create("sb", f.s.IDs.EmptyTree())
	root := r.Path()
	p := func(rel string) string { return filepath.Join(root, rel) }
	h0 := Merged(t, root)
	zero := f.checkpoint(r)

	Write(t, p("data/app.db"), "version 1\n")    // a file of the layer
	Write(t, p("etc/config"), "port=2\n")        // a base file, copied up
	Write(t, p("src/main.go"), "package main\n") // copied up, deleted below
	Settle()
	a := f.checkpoint(r)
	ha := Merged(t, root)
	ino := func(rel string) uint64 {
		t.Helper()
		var st unix.Stat_t
		must(t, unix.Lstat(p(rel), &st))
		return st.Ino
	}
	kept := []string{"data/app.db", "etc/config", "data"}
	want := map[string]uint64{}
	for _, rel := range kept {
		want[rel] = ino(rel)
	}

	// The next turn rewrites both files in place, adds one and deletes a
	// copied-up base file.
	for rel, body := range map[string]string{"data/app.db": "version 2, longer\n", "etc/config": "port=3\n"} {
		fh, err := os.OpenFile(p(rel), os.O_WRONLY|os.O_TRUNC, 0)
		must(t, err)
		_, err = fh.WriteString(body)
		must(t, err)
		must(t, fh.Close())
	}
	Write(t, p("data/extra"), "new\n")
	must(t, os.Remove(p("src/main.go")))
	Settle()
	b := f.checkpoint(r)
	hb := Merged(t, root)

	for _, step := range []struct {
		name string
		res  *fstree.ScanResult
		want delta.ID
	}{{"A", a, ha}, {"B", b, hb}, {"A again", a, ha}} {
		must(t, r.Restore(f.ctx, step.res.Root, f.store))
		if got := Merged(t, root); got != step.want {
			t.Fatalf("restore %s: root hashes to %s, want %s", step.name, got.Short(), step.want.Short())
		}
		for _, rel := range kept {
			if got := ino(rel); got != want[rel] {
				t.Errorf("restore %s: %s has inode %d, had %d", step.name, rel, got, want[rel])
			}
		}
		Settle()
		res, err := r.Scan(f.ctx, f.store)
		must(t, err)
		if res.StateKey != step.res.StateKey {
			t.Fatalf("restore %s: scan gives key %s, want %s", step.name, res.StateKey.Short(), step.res.StateKey.Short())
		}
	}
	// Back past the copy-up: every base file reads as the base has it.
	must(t, r.Restore(f.ctx, b.Root, f.store))
	must(t, r.Restore(f.ctx, zero.Root, f.store))
	if got := Merged(t, root); got != h0 {
		t.Fatalf("restore of the empty layer: root hashes to %s, want the base's %s", got.Short(), h0.Short())
	}
	if data, err := os.ReadFile(p("src/main.go")); err != nil || string(data) != "package main\n" {
		t.Fatalf("base file after rolling back its copy-up and deletion: %q, %v", data, err)
	}
}
