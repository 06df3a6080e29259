package procs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// Tests of the Manager on its own: a real home directory, a real runtime
// where the host has runc and CRIU (procs_run_test.go), the engine's part
// (locks, the catalog, the store) played by a directory root and blobs in
// memory.

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// blobs is a content store in memory: what Dump saves, Image reads back.
type blobs struct {
	mu sync.Mutex
	m  map[delta.ID][]byte
}

func (b *blobs) SaveBlob(_ context.Context, _ delta.BlobType, id delta.ID, plain []byte) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[id]; ok {
		return false, nil
	}
	b.m[id] = append([]byte(nil), plain...)
	return true, nil
}

func (b *blobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	data, ok := b.m[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return data, nil
}

// dirRoot is a sandbox root that is a plain directory (already "mounted").
type dirRoot string

func (dirRoot) Mount(context.Context) error { return nil }
func (r dirRoot) Path() string              { return string(r) }

// fixture is a Manager whose engine knows one sandbox, "s", on root.
type fixture struct {
	m      *Manager
	blobs  *blobs
	head   *delta.Checkpoint
	intr   *Interrupted
	phases []string
	loads  []bool // Load's write argument, per call
}

func newFixture(t testing.TB, root string) *fixture {
	t.Helper()
	f := &fixture{blobs: &blobs{m: map[delta.ID][]byte{}}, head: &delta.Checkpoint{}}
	f.m = New(Deps{
		Home:   filepath.Join(t.TempDir(), "home"),
		Phase:  func(p string) { f.phases = append(f.phases, p) },
		IDs:    func() delta.IDs { return delta.IDs{} },
		Loader: func() delta.BlobLoader { return f.blobs },
		Load: func(_ context.Context, name delta.SandboxName, write bool) (*Sandbox, func(), error) {
			f.loads = append(f.loads, write)
			if name != "s" {
				return nil, nil, errdefs.ErrNotFound
			}
			return &Sandbox{Root: dirRoot(root), Head: f.head, Interrupted: f.intr}, func() {}, nil
		},
	})
	return f
}

// The names a home's containers and bookkeeping go by: the bench harness
// and the CLI's kill tests derive them the same way from the home's path.
func TestNamesDeriveFromTheHome(t *testing.T) {
	a, b := New(Deps{Home: "/homes/a"}), New(Deps{Home: "/homes/b"})
	sum := sha256.Sum256([]byte("/homes/a"))
	scope := hex.EncodeToString(sum[:6])
	if a.Scope() != scope || a.ContainerID("agent") != "ts-"+scope+"-agent" {
		t.Fatalf("scope %s, container id %s; want %s", a.Scope(), a.ContainerID("agent"), scope)
	}
	if a.ContainerID("agent") == b.ContainerID("agent") || a.StateRoot() == b.StateRoot() {
		t.Fatal("two homes share a container id or a state root")
	}
	if a.StateRoot() != "/run/turnsnap/"+scope || a.Dir() != "/homes/a/proc" || a.WorkDir() != "/homes/a/proc/work" {
		t.Fatalf("state root %s, dir %s, work %s", a.StateRoot(), a.Dir(), a.WorkDir())
	}
	if a.RestoredFile("agent") != "/homes/a/proc/agent.restored" || a.baselineFile("agent") != "/homes/a/proc/agent.baseline.json" {
		t.Fatalf("restored %s, baseline %s", a.RestoredFile("agent"), a.baselineFile("agent"))
	}
}

// CleanWork removes what a killed turnsnap left in the work directory and
// keeps the directories of live processes (this one's).
func TestCleanWorkKeepsOnlyLiveWork(t *testing.T) {
	f := newFixture(t, t.TempDir())
	mine, err := f.m.work("image")
	must(t, err)
	if fi, err := os.Stat(f.m.WorkDir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("work dir: %v %v", fi.Mode(), err)
	}
	dead := filepath.Join(f.m.WorkDir(), "image-"+proc.Holder{PID: os.Getpid(), Start: 1}.String()+"-x")
	junk := filepath.Join(f.m.WorkDir(), "junk")
	for _, d := range []string{dead, junk} {
		must(t, os.MkdirAll(filepath.Join(d, "img"), 0o700))
	}
	f.m.CleanWork()
	if _, err := os.Stat(mine); err != nil {
		t.Fatalf("a live process's work dir was removed: %v", err)
	}
	for _, d := range []string{dead, junk} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s survived: %v", filepath.Base(d), err)
		}
	}
}

// A sandbox that never ran a container needs no runtime (no runc, no
// CRIU) for anything but exec.
func TestNoContainerNeedsNoRuntime(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, t.TempDir())
	id := delta.Hash([]byte("head"))
	f.head = &delta.Checkpoint{ID: id}
	f.intr = &Interrupted{ProcessesLost: "test"}
	if running, err := f.m.Running(ctx, f.m.Container("s")); err != nil || running {
		t.Fatalf("running %v, %v", running, err)
	}
	must(t, f.m.Stop(ctx, f.m.Container("s")))
	if resumed, running, err := f.m.Recover(ctx, "s"); err != nil || resumed || running {
		t.Fatalf("recover: resumed %v running %v err %v", resumed, running, err)
	}
	l, err := f.m.List(ctx, "s", ProcessesOptions{})
	must(t, err)
	if l.Running || l.Head != id || l.HeadHasImage || len(l.Processes) != 0 || l.Interrupted != f.intr {
		t.Fatalf("list: %+v", l)
	}
	if _, err := f.m.Resume(ctx, "s"); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("resume without a container: %v", err)
	}
	if _, err := f.m.List(ctx, "missing", ProcessesOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("list of a missing sandbox: %v", err)
	}
	// ps only reads; resume loads as a write does (finishing interrupted
	// work first).
	if want := []bool{false, true, false}; len(f.loads) != len(want) || f.loads[0] || !f.loads[1] || f.loads[2] {
		t.Fatalf("loads %v, want %v", f.loads, want)
	}
	if f.m.rt != nil {
		t.Fatal("the runtime was made")
	}
	// A checkpoint without processes needs no host check; one whose host
	// facts do not parse is corrupt before any runtime is asked.
	must(t, f.m.CheckHost(ctx, &delta.Checkpoint{}))
	img := delta.Hash([]byte("img"))
	if err := f.m.CheckHost(ctx, &delta.Checkpoint{ProcTree: &img, Host: json.RawMessage("{")}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("unreadable host facts: %v", err)
	}
}

// What a turn calls a process change, before it asks proc.Changed.
func TestChangedAgainstTheHead(t *testing.T) {
	f := newFixture(t, t.TempDir())
	img := delta.Hash([]byte("img"))
	none, withImage := &delta.Checkpoint{}, &delta.Checkpoint{ProcTree: &img}
	idle := proc.ProcSet{TmpfsPristine: true}
	shm := proc.ProcSet{}
	one := proc.ProcSet{TmpfsPristine: true, Procs: []proc.Process{{PID: 7, Start: 42, Cmdline: []string{"sleep", "9"}}}}
	for _, c := range []struct {
		cur     proc.ProcSet
		head    *delta.Checkpoint
		changed bool
		reason  string
	}{
		{idle, none, false, ""},
		{idle, withImage, true, "ended"},
		{shm, none, true, "tmpfs"},
		{one, none, true, "not yet in any checkpoint"},
	} {
		changed, reason := f.m.changed("s", c.cur, c.head)
		if changed != c.changed || (c.changed && !strings.Contains(reason, c.reason)) {
			t.Errorf("cur %+v head image %v: changed %v %q, want %v %q", c.cur, c.head.ProcTree != nil, changed, reason, c.changed, c.reason)
		}
	}
	// Against the baseline the last process checkpoint left.
	data, err := json.Marshal(one)
	must(t, err)
	must(t, os.MkdirAll(f.m.Dir(), 0o700))
	must(t, os.WriteFile(f.m.baselineFile("s"), data, 0o600))
	if changed, reason := f.m.changed("s", one, withImage); changed {
		t.Fatalf("the baseline's own processes changed: %s", reason)
	}
	other := proc.ProcSet{TmpfsPristine: true, Procs: []proc.Process{{PID: 8, Start: 43}}}
	if changed, _ := f.m.changed("s", other, withImage); !changed {
		t.Fatal("other processes than the baseline's are no change")
	}
}

func TestInterruptedDescribe(t *testing.T) {
	var none *Interrupted
	if none.Describe("s") != "" {
		t.Fatal("nothing interrupted describes itself")
	}
	id := delta.Hash([]byte("target"))
	got := (&Interrupted{Rollback: &id, ProcessesLost: "why"}).Describe("s")
	if !strings.Contains(got, id.Short()) || !strings.Contains(got, "rollback s --abandon") || !strings.Contains(got, "processes not restored: why") {
		t.Fatalf("describe: %q", got)
	}
}
