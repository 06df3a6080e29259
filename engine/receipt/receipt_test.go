package receipt

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/statememo"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/proc"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// noStore is a loader with nothing in it: every tree a test needs is a
// scan's, kept in a statememo.Trees.
type noStore struct{}

func (noStore) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	return nil, errors.New("no blob " + id.Short())
}

// dirRoot is a root that is a plain directory, scanned whole.
type dirRoot struct {
	dir       string
	committed int
}

func (r *dirRoot) Path() string                       { return r.dir }
func (r *dirRoot) Mount(context.Context) error        { return nil }
func (r *dirRoot) Unmount(context.Context) error      { return nil }
func (r *dirRoot) Remove(context.Context) error       { return nil }
func (r *dirRoot) Committed(*fstree.ScanResult) error { r.committed++; return nil }
func (r *dirRoot) Restore(context.Context, delta.ID, delta.BlobLoader) error {
	return errors.New("not restored")
}
func (r *dirRoot) Scan(ctx context.Context, saver delta.BlobSaver) (*fstree.ScanResult, error) {
	return fstree.Scan(ctx, r.dir, fstree.ScanOptions{Saver: saver})
}

// fakeProcs is a container that never restores and never runs.
type fakeProcs struct {
	dir   string
	stops int
}

func (p *fakeProcs) Restore(context.Context, procs.Container, string, string, *delta.Checkpoint) error {
	return errors.New("not restored")
}
func (p *fakeProcs) Inventory(context.Context, string) (proc.Inventory, error) {
	return proc.Inventory{}, errors.New("no container")
}
func (p *fakeProcs) Stop(context.Context, procs.Container) error { p.stops++; return nil }
func (p *fakeProcs) Container(name delta.SandboxName) procs.Container {
	return procs.Container{Sandbox: name}
}
func (p *fakeProcs) RestoredFile(name string) string { return filepath.Join(p.dir, name+".restored") }

func newChecker(t *testing.T, memo *statememo.Trees, o Options) (*Checker, *fakeProcs) {
	p := &fakeProcs{dir: t.TempDir()}
	return New(Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Phase: func(string) {}, Procs: p,
		Loader:   func() delta.BlobLoader { return memo },
		Scanners: func() []rootfs.TurnScanner { return nil },
	}, o), p
}

// layers scans an empty base and root (a file and a bound unix socket)
// into memo and returns the checkpoint of that state.
func layers(t *testing.T, memo *statememo.Trees) (*delta.Checkpoint, string) {
	ctx := context.Background()
	base, root := t.TempDir(), t.TempDir()
	must(t, os.WriteFile(filepath.Join(root, "f"), []byte("the agent's file\n"), 0o644))
	l, err := net.Listen("unix", filepath.Join(root, "s.sock"))
	must(t, err)
	t.Cleanup(func() { l.Close() })
	b, err := fstree.Scan(ctx, base, fstree.ScanOptions{Saver: memo})
	must(t, err)
	r, err := fstree.Scan(ctx, root, fstree.ScanOptions{Saver: memo})
	must(t, err)
	return &delta.Checkpoint{ID: delta.ID{1}, BaseTree: b.Root, FSTree: r.Root, StateKey: r.StateKey}, root
}

// A socket node's new mtime is restore noise; a changed file is not.
func TestOnlyRestoreNoise(t *testing.T) {
	ctx := context.Background()
	memo := statememo.NewTrees(noStore{})
	cp, root := layers(t, memo)
	later := time.Now().Add(time.Hour)
	must(t, os.Chtimes(filepath.Join(root, "s.sock"), later, later))
	res, err := fstree.Scan(ctx, root, fstree.ScanOptions{Saver: memo})
	must(t, err)
	if res.Root == cp.FSTree {
		t.Fatal("the socket's new mtime changed no tree")
	}
	if ok, why, err := OnlyRestoreNoise(ctx, memo, cp, res.Root); err != nil || !ok {
		t.Fatalf("socket mtime: ok %v, why %q, err %v", ok, why, err)
	}
	must(t, os.WriteFile(filepath.Join(root, "f"), []byte("changed\n"), 0o644))
	res, err = fstree.Scan(ctx, root, fstree.ScanOptions{Saver: memo})
	must(t, err)
	if ok, why, err := OnlyRestoreNoise(ctx, memo, cp, res.Root); err != nil || ok || !strings.Contains(why, "f") {
		t.Fatalf("changed file: ok %v, why %q, err %v", ok, why, err)
	}
}

// AcceptRestored records a state with socket noise as the checkpoint's
// for RestoredAs, and commits the scan of a state that is exactly it.
func TestAcceptRestored(t *testing.T) {
	ctx := context.Background()
	memo := statememo.NewTrees(noStore{})
	cp, dir := layers(t, memo)
	c, _ := newChecker(t, memo, Options{})
	root := &dirRoot{dir: dir}
	c.AcceptRestored(ctx, "s", root, cp)
	if root.committed != 1 || c.RestoredAs("s", cp.ID, cp.StateKey) {
		t.Fatalf("exact state: committed %d, recorded %v", root.committed, c.RestoredAs("s", cp.ID, cp.StateKey))
	}
	later := time.Now().Add(time.Hour)
	must(t, os.Chtimes(filepath.Join(dir, "s.sock"), later, later))
	c.AcceptRestored(ctx, "s", root, cp)
	res, err := fstree.Scan(ctx, dir, fstree.ScanOptions{})
	must(t, err)
	if root.committed != 1 || !c.RestoredAs("s", cp.ID, res.StateKey) || c.RestoredAs("s", delta.ID{2}, res.StateKey) {
		t.Fatalf("noise: committed %d, recorded %v", root.committed, c.RestoredAs("s", cp.ID, res.StateKey))
	}
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("changed\n"), 0o644))
	c.AcceptRestored(ctx, "s", root, cp)
	if c.RestoredAs("s", cp.ID, res.StateKey) {
		t.Fatal("a changed file left the accepted state")
	}
}

// The files' receipt of a plain directory root: a scan of it, matching
// the checkpoint; a changed file fails it; Unchecked skips the check.
func TestFilesReceipt(t *testing.T) {
	ctx := context.Background()
	memo := statememo.NewTrees(noStore{})
	cp, dir := layers(t, memo)
	c, procs := newChecker(t, memo, Options{})
	rc, restored, err := c.Check(ctx, "rollback", "s", &dirRoot{dir: dir}, cp, "test", delta.ID{}, "", false)
	must(t, err)
	if !rc.OK || !rc.Files.Match || rc.Files.Got != cp.FSTree || restored || len(rc.NotRestored) == 0 {
		t.Fatalf("receipt %+v, processes restored %v", rc, restored)
	}
	// A process restore that fails is an error, not a receipt.
	if rc, _, err := c.Check(ctx, "rollback", "s", &dirRoot{dir: dir}, cp, "test", delta.ID{}, "", true); err == nil || rc != nil {
		t.Fatalf("failed process restore: receipt %+v, err %v", rc, err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("changed\n"), 0o644))
	rc = c.Files(ctx, "rollback", "s", &dirRoot{dir: dir}, cp, "test", delta.ID{})
	if rc.OK || rc.Files.Mismatch == "" {
		t.Fatalf("receipt of a changed root %+v", rc)
	}
	// Files that differ: no process restore is tried.
	if _, restored, err := c.Check(ctx, "rollback", "s", &dirRoot{dir: dir}, cp, "test", delta.ID{}, "", true); err != nil || restored {
		t.Fatalf("the files differ: processes restored %v, err %v", restored, err)
	}
	err = c.Fail(ctx, rc)
	var ri *RestoreIncompleteError
	if !errors.As(err, &ri) || !errors.Is(err, errdefs.ErrRestoreIncomplete) || procs.stops != 1 ||
		!strings.Contains(err.Error(), "no process running") || !strings.Contains(err.Error(), "files: ") {
		t.Fatalf("fail: %v (stops %d)", err, procs.stops)
	}
	u, _ := newChecker(t, memo, Options{Unchecked: true})
	if rc := u.Files(ctx, "rollback", "s", &dirRoot{dir: dir}, cp, "test", delta.ID{}); !rc.OK || !strings.Contains(rc.Files.Mismatch, "unchecked") {
		t.Fatalf("unchecked receipt %+v", rc)
	}
}

// A root the restore proved but that is not mounted is a mismatch.
func TestVerifiedRootMustBeMounted(t *testing.T) {
	ctx := context.Background()
	memo := statememo.NewTrees(noStore{})
	cp, dir := layers(t, memo)
	c, _ := newChecker(t, memo, Options{})
	rc := c.Files(ctx, "branch", "s", &dirRoot{dir: dir}, cp, "test", cp.FSTree)
	if rc.OK || !strings.Contains(rc.Files.Mismatch, "not") || rc.Files.Checked != "the restore's verification; the root mounted" {
		t.Fatalf("receipt of an unmounted directory %+v", rc.Files)
	}
}

func TestWrittenHow(t *testing.T) {
	root := &dirRoot{dir: t.TempDir()}
	for _, tc := range []struct {
		info    rootfs.RestoreInfo
		stacked bool
		want    string
	}{
		{rootfs.RestoreInfo{}, true, "stacked"},
		{rootfs.RestoreInfo{Fallback: "why"}, false, "(why)"},
		{rootfs.RestoreInfo{Live: "walk"}, false, "diff written"},
		{rootfs.RestoreInfo{}, false, "rebuilt"},
	} {
		if got := WrittenHow(root, tc.info, tc.stacked); !strings.Contains(got, tc.want) {
			t.Errorf("%+v stacked %v: %q", tc.info, tc.stacked, got)
		}
	}
	if got := RestoredTree(root, rootfs.RestoreInfo{Verified: delta.ID{5}}); got != (delta.ID{5}) {
		t.Errorf("restored tree %s", got.Short())
	}
}
