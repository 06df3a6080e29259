package roottest

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// MemStore stands in for the repository in the suite, so it must check
// hashes, tell missing from corrupt, and keep what it is given.
func TestMemStore(t *testing.T) {
	ctx := context.Background()
	m := NewMemStore()
	if m.Len() != 1 {
		t.Fatalf("a new store holds %d blobs, want the empty tree alone", m.Len())
	}
	if _, err := m.LoadBlob(ctx, delta.BlobTree, delta.EmptyTree()); err != nil {
		t.Fatalf("the empty tree: %v", err)
	}
	data := []byte("needle in a blob")
	id := delta.Hash(data)
	if fresh, err := m.SaveBlob(ctx, delta.BlobData, id, data); !fresh || err != nil {
		t.Fatalf("first save: %v %v", fresh, err)
	}
	data[0] = 'N' // the store keeps its own copy
	if fresh, err := m.SaveBlob(ctx, delta.BlobData, id, data); fresh || err != nil {
		t.Fatalf("second save: %v %v, want not fresh", fresh, err)
	}
	got, err := m.LoadBlob(ctx, delta.BlobData, id)
	if err != nil || string(got) != "needle in a blob" {
		t.Fatalf("load: %q %v", got, err)
	}
	if !m.Holds([]byte("needle")) || m.Holds([]byte("haystack")) {
		t.Fatal("Holds does not report what is stored")
	}
	if m.Len() != 2 || m.Bytes() != int64(len(got)+len((&delta.Tree{}).Encode())) {
		t.Fatalf("Len %d Bytes %d", m.Len(), m.Bytes())
	}
	if _, err := m.LoadBlob(ctx, delta.BlobData, delta.Hash([]byte("absent"))); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("absent blob: %v, want ErrNotFound", err)
	}
	// A blob saved under the wrong ID fails its check on load.
	wrong := delta.Hash([]byte("other"))
	if _, err := m.SaveBlob(ctx, delta.BlobData, wrong, []byte("not other")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.LoadBlob(ctx, delta.BlobData, wrong); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("mislabelled blob: %v, want ErrCorrupt", err)
	}
	m.Corrupt(id)
	if _, err := m.LoadBlob(ctx, delta.BlobData, id); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("corrupted blob: %v, want ErrCorrupt", err)
	}
}

// fatal records a helper's t.Fatal instead of ending the test, so a test
// can see that a check fails.
type fatal struct {
	testing.TB
	msg string
}

type stop struct{}

func (f *fatal) Helper()                      {}
func (f *fatal) Fatal(args ...any)            { f.msg = fmt.Sprint(args...); panic(stop{}) }
func (f *fatal) Fatalf(s string, args ...any) { f.msg = fmt.Sprintf(s, args...); panic(stop{}) }

// fails runs check with a recording TB and returns its fatal message.
func fails(t *testing.T, check func(tb testing.TB)) (msg string) {
	f := &fatal{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stop); !ok {
				panic(r)
			}
			msg = f.msg
		}
	}()
	check(f)
	return ""
}

// CheckSparse accepts WriteSparse's file and refuses one whose holes were
// filled or whose data differs.
func TestSparseHelpers(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d/sparse")
	WriteSparse(t, p)
	CheckSparse(t, p)

	// Zeros written into a hole read the same but take disk: a restore
	// that wrote them would pass a content check and not this one.
	filled := filepath.Join(t.TempDir(), "filled")
	WriteSparse(t, filled)
	g, err := os.OpenFile(filled, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.WriteAt(make([]byte, 256<<10), 300<<20)
	g.Close()
	if err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, func(tb testing.TB) { CheckSparse(tb, filled) }); msg == "" {
		t.Fatal("CheckSparse accepted a file whose holes were filled with zeros")
	}

	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("X"), 900<<20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, func(tb testing.TB) { CheckSparse(tb, p) }); msg == "" {
		t.Fatal("CheckSparse accepted changed data")
	}
}

// AgentTurn changes what Merged sees; Merged is stable for an unchanged
// root; Move renames.
func TestAgentTurnChangesMerged(t *testing.T) {
	testenv.RequireRoot(t) // AgentTurn chowns
	dir := RichBase(t)
	before := Merged(t, dir)
	if again := Merged(t, dir); again != before {
		t.Fatal("Merged differs for an unchanged root")
	}
	AgentTurn(t, dir)
	if Merged(t, dir) == before {
		t.Fatal("Merged did not change after an agent turn")
	}
	for _, gone := range []string{"src/lib/b.go", "deep/a", "links/two", "doomed/x"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived the agent turn (%v)", gone, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(dir, "moved/b/c/file")); err != nil || string(data) != "deep\n" {
		t.Errorf("moved/b/c/file: %q %v", data, err)
	}
}

// Tree lists directories and regular files only, relative, in walk order;
// Pick picks from a list and "" from none.
func TestTreeAndPick(t *testing.T) {
	dir := t.TempDir()
	Write(t, filepath.Join(dir, "a/b/f"), "f")
	Write(t, filepath.Join(dir, "g"), "g")
	if err := os.Symlink("g", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	dirs, files := Tree(dir)
	if !slices.Equal(dirs, []string{"a", "a/b"}) || !slices.Equal(files, []string{"a/b/f", "g"}) {
		t.Fatalf("Tree: dirs %q files %q", dirs, files)
	}
	rng := rand.New(rand.NewSource(1))
	if Pick(rng, nil) != "" {
		t.Fatal("Pick from nothing")
	}
	seen := map[string]bool{}
	for range 100 {
		seen[Pick(rng, files)] = true
	}
	if len(seen) != 2 || !seen["g"] || !seen["a/b/f"] {
		t.Fatalf("Pick over 100 draws saw %v", seen)
	}
}

// Settle waits out the scan cache's racy window, no less.
func TestSettle(t *testing.T) {
	start := time.Now()
	Settle()
	if d := time.Since(start); d < fstree.RacyWindow {
		t.Fatalf("Settle waited %v, less than the racy window %v", d, fstree.RacyWindow)
	}
}
