package fleet

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// The checker's own parts, without a fleet: each must see what it is for.

// The digest changes with content, permissions, a symlink's target and a
// name, and not with an mtime.
func TestTreeDigestSeesChanges(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "a/b"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "a/b/f"), []byte("one"), 0o644))
	must(os.Symlink("f", filepath.Join(dir, "a/b/l")))
	digest := func() string {
		t.Helper()
		d, err := treeDigest(dir)
		must(err)
		return d
	}
	seen := map[string]string{digest(): "start"}
	changes := []struct {
		what string
		do   func() error
	}{
		{"content", func() error { return os.WriteFile(filepath.Join(dir, "a/b/f"), []byte("two"), 0o644) }},
		{"mode", func() error { return os.Chmod(filepath.Join(dir, "a/b/f"), 0o600) }},
		{"symlink target", func() error {
			os.Remove(filepath.Join(dir, "a/b/l"))
			return os.Symlink("g", filepath.Join(dir, "a/b/l"))
		}},
		{"name", func() error { return os.Rename(filepath.Join(dir, "a/b/f"), filepath.Join(dir, "a/b/g")) }},
		{"empty directory", func() error { return os.Mkdir(filepath.Join(dir, "a/c"), 0o755) }},
	}
	for _, c := range changes {
		must(c.do())
		d := digest()
		if prev, ok := seen[d]; ok {
			t.Fatalf("after a change of %s the digest is the one of %s", c.what, prev)
		}
		seen[d] = c.what
	}
	before := digest()
	old := time.Now().Add(-time.Hour)
	must(os.Chtimes(filepath.Join(dir, "a/b/g"), old, old))
	if digest() != before {
		t.Fatal("an mtime changed the digest; a restore need not keep a file's mtime for its bytes to be equal")
	}
}

// A write accepted from a host that did not own the sandbox is a
// violation; the owner's writes, the adopter's after or during its adopt,
// and a write that overlaps an adopt are not.
func TestWriterCheck(t *testing.T) {
	w := newWorld()
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	w.addSandbox("s", 1, delta.ID{1}, at(0))
	write := func(h, from, to int) {
		w.writes = append(w.writes, span{sandbox: "s", host: h, id: delta.ID{byte(10 + from)}, start: at(from), end: at(to)})
	}
	write(1, 1, 2) // the creator
	w.adopts = append(w.adopts, span{sandbox: "s", host: 2, start: at(5), end: at(6)})
	write(1, 4, 7)   // overlaps the adopt: either may have owned it
	write(2, 5, 8)   // the adopter, during its adopt
	write(2, 9, 10)  // the adopter
	write(3, 11, 12) // never owned it
	write(1, 13, 14) // fenced since the adopt
	inBucket := func(string, delta.ID) bool { return true }
	got := w.writerViolationsLocked(inBucket)
	if len(got) != 2 {
		t.Fatalf("violations %q, want h3's write at 11 s and h1's at 13 s", got)
	}
}

// Head versions: one writer per epoch, epochs never down; a version no
// host can be named for is left out.
func TestHeadViolations(t *testing.T) {
	t0 := time.Now()
	v := func(s int, id byte, home string, epoch uint64) headVersion {
		return headVersion{at: t0.Add(time.Duration(s) * time.Second), id: delta.ID{id}, owner: delta.Owner{Home: home, Epoch: epoch}}
	}
	homes := map[string]int{"a": 1, "b": 2}
	// Without owner lines: ids 1x by host 1, 2x by host 2, 3x by either
	// (a rollback of each to the same checkpoint), 9 by no one known.
	byID := func(x headVersion) map[int]bool {
		if !x.owner.IsZero() {
			return map[int]bool{homes[x.owner.Home]: true}
		}
		switch x.id[0] / 10 {
		case 1:
			return map[int]bool{1: true}
		case 2:
			return map[int]bool{2: true}
		case 3:
			return map[int]bool{1: true, 2: true}
		}
		return nil
	}
	cases := []struct {
		name string
		vs   []headVersion
		want int
	}{
		{"one writer", []headVersion{v(1, 10, "", 0), v(2, 30, "", 0), v(3, 11, "", 0), v(4, 9, "", 0)}, 0},
		{"two writers at epoch 0", []headVersion{v(1, 10, "", 0), v(2, 30, "", 0), v(3, 20, "", 0), v(4, 11, "", 0)}, 1},
		{"an adopt", []headVersion{v(1, 10, "", 0), v(2, 11, "a", 1), v(3, 20, "b", 2), v(4, 21, "b", 2)}, 0},
		{"a fenced writer got through", []headVersion{v(1, 10, "a", 1), v(2, 20, "b", 2), v(3, 11, "a", 2)}, 1},
		{"epoch down", []headVersion{v(1, 10, "a", 1), v(2, 20, "b", 2), v(3, 11, "a", 1)}, 1},
	}
	for _, c := range cases {
		if got := headViolations(c.vs, byID); len(got) != c.want {
			t.Errorf("%s: %d violations %q, want %d", c.name, len(got), got, c.want)
		}
	}
}
