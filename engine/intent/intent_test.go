package intent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fakeRoot records the trees restored onto it.
type fakeRoot struct {
	dir      string
	restored []delta.ID
}

func (r *fakeRoot) Path() string                       { return r.dir }
func (r *fakeRoot) Mount(context.Context) error        { return nil }
func (r *fakeRoot) Unmount(context.Context) error      { return nil }
func (r *fakeRoot) Remove(context.Context) error       { return nil }
func (r *fakeRoot) Committed(*fstree.ScanResult) error { return nil }
func (r *fakeRoot) Scan(context.Context, delta.BlobSaver) (*fstree.ScanResult, error) {
	return nil, errors.New("not scanned")
}
func (r *fakeRoot) Restore(_ context.Context, tree delta.ID, _ delta.BlobLoader) error {
	r.restored = append(r.restored, tree)
	return nil
}

// fakeProcs counts stops and refuses every process restore.
type fakeProcs struct{ stops int }

func (p *fakeProcs) Stop(context.Context, procs.Container) error { p.stops++; return nil }
func (p *fakeProcs) CheckHost(context.Context, *delta.Checkpoint) error {
	return errors.New("no CRIU here")
}
func (p *fakeProcs) Restore(context.Context, procs.Container, string, string, *delta.Checkpoint) error {
	return errors.New("not restored")
}

type fixture struct {
	s     *Intents
	dir   string
	cps   map[delta.ID]*delta.Checkpoint
	heads []delta.ID
	procs *fakeProcs
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{dir: filepath.Join(t.TempDir(), "intents"), cps: map[delta.ID]*delta.Checkpoint{}, procs: &fakeProcs{}}
	f.s = New(Deps{Dir: f.dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Procs: f.procs,
		Phase: func(string) {}, Untrack: func(string) {},
		Checkpoint: func(_ context.Context, id delta.ID) (*delta.Checkpoint, error) {
			if cp, ok := f.cps[id]; ok {
				return cp, nil
			}
			return nil, errdefs.ErrNotFound
		},
		MoveHead: func(_ context.Context, _ string, _ *delta.Sandbox, id delta.ID) error {
			f.heads = append(f.heads, id)
			return nil
		},
		ReadyImage: func(context.Context, *delta.Checkpoint, bool) (string, func(), error) {
			return "", func() {}, nil
		},
		AcceptRestored: func(context.Context, string, rootfs.Root, *delta.Checkpoint) {},
	})
	return f
}

func sandbox(name string) *delta.Sandbox {
	return &delta.Sandbox{ID: delta.NewSandboxID(), Name: delta.SandboxName(name), Created: time.Now().Add(-time.Minute)}
}

func TestWritePendingClear(t *testing.T) {
	f := newFixture(t)
	sb := sandbox("s")
	if _, ok := f.s.Pending(sb); ok || f.s.Interrupted(sb) != nil {
		t.Fatal("an intent before any was written")
	}
	want := Rollback{Target: delta.ID{1, 2}, Processes: true}
	must(t, f.s.Write(sb, want))
	if got, ok := f.s.Pending(sb); !ok || got != want {
		t.Fatalf("pending %+v %v, want %+v", got, ok, want)
	}
	if in := f.s.Interrupted(sb); in == nil || in.Rollback == nil || *in.Rollback != want.Target || in.ProcessesLost != "" {
		t.Fatalf("interrupted %+v", in)
	}
	// Another sandbox of the same name (another key) has none.
	if _, ok := f.s.Pending(sandbox("s")); ok {
		t.Fatal("the intent reached another sandbox of the same name")
	}
	must(t, f.s.Clear(sb))
	if _, ok := f.s.Pending(sb); ok {
		t.Fatal("the intent outlived Clear")
	}
	must(t, f.s.Clear(sb)) // nothing to clear
}

func TestLegacyAndTornIntents(t *testing.T) {
	f := newFixture(t)
	must(t, os.MkdirAll(f.dir, 0o700))
	sb := sandbox("s")
	legacy := filepath.Join(f.dir, "rollback-s")
	must(t, os.WriteFile(legacy, []byte(delta.ID{7}.String()+"\n"), 0o600))
	if in, ok := f.s.Pending(sb); !ok || in.Target != (delta.ID{7}) || in.Processes {
		t.Fatalf("legacy intent written after the sandbox: %+v %v", in, ok)
	}
	old := sb.Created.Add(-time.Hour)
	must(t, os.Chtimes(legacy, old, old))
	if _, ok := f.s.Pending(sb); ok {
		t.Fatal("a legacy intent older than the sandbox applies")
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Fatalf("the older legacy intent stays: %v", err)
	}
	must(t, fsat.WriteFileDurable(filepath.Join(f.dir, string(sb.Key())+".rollback"), "not an id\n"))
	if _, ok := f.s.Pending(sb); ok {
		t.Fatal("a torn intent applies")
	}
}

func TestProcsLost(t *testing.T) {
	f := newFixture(t)
	sb := sandbox("s")
	f.s.NoteProcsLost(sb, "criu failed")
	if in := f.s.Interrupted(sb); in == nil || in.ProcessesLost != "criu failed" || in.Rollback != nil {
		t.Fatalf("interrupted %+v", in)
	}
	f.s.NoteProcsLost(sb, "")
	if in := f.s.Interrupted(sb); in == nil || in.ProcessesLost != "reason not recorded" {
		t.Fatalf("interrupted %+v", in)
	}
	f.s.ClearProcsLost(sb)
	if in := f.s.Interrupted(sb); in != nil {
		t.Fatalf("interrupted after ClearProcsLost %+v", in)
	}
}

func TestFinish(t *testing.T) {
	ctx := context.Background()
	head := &delta.Checkpoint{ID: delta.ID{1}, BaseTree: delta.ID{9}, FSTree: delta.ID{11}}
	target := &delta.Checkpoint{ID: delta.ID{2}, BaseTree: delta.ID{9}, FSTree: delta.ID{12}, ProcTree: &delta.ID{13}}
	other := &delta.Checkpoint{ID: delta.ID{3}, BaseTree: delta.ID{8}, FSTree: delta.ID{14}}
	for _, tc := range []struct {
		name     string
		in       Rollback
		want     *delta.Checkpoint // the head after
		restored bool
		lost     bool
	}{
		{"to its target, processes lost", Rollback{Target: target.ID, Processes: true}, target, true, true},
		{"to its target, files only", Rollback{Target: target.ID}, target, true, false},
		{"target unknown: back to the head", Rollback{Target: delta.ID{4}}, head, true, false},
		{"target on another base: dropped", Rollback{Target: other.ID}, head, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			for _, cp := range []*delta.Checkpoint{head, target, other} {
				f.cps[cp.ID] = cp
			}
			sb, root := sandbox("s"), &fakeRoot{dir: t.TempDir()}
			must(t, f.s.Write(sb, tc.in))
			got, err := f.s.Finish(ctx, "s", Sandbox{Sandbox: sb, Root: root, Head: head}, tc.in)
			must(t, err)
			if got != tc.want {
				t.Fatalf("head %s, want %s", got.ID.Short(), tc.want.ID.Short())
			}
			if tc.restored != (len(root.restored) == 1 && root.restored[0] == tc.want.FSTree) ||
				tc.restored != (len(f.heads) == 1 && f.heads[0] == tc.want.ID) {
				t.Fatalf("restored %v, heads moved %v", root.restored, f.heads)
			}
			if _, ok := f.s.Pending(sb); ok {
				t.Fatal("the intent stays")
			}
			if in := f.s.Interrupted(sb); tc.lost != (in != nil && strings.Contains(in.ProcessesLost, "no CRIU here")) {
				t.Fatalf("interrupted %+v", in)
			}
		})
	}
}

func TestAbandon(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	head := &delta.Checkpoint{ID: delta.ID{1}, BaseTree: delta.ID{9}, FSTree: delta.ID{11}}
	sb, root := sandbox("s"), &fakeRoot{dir: t.TempDir()}
	st := Sandbox{Sandbox: sb, Root: root, Head: head, Dir: root.dir}
	if err := f.s.Abandon(ctx, "s", st); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("abandon without an intent: %v", err)
	}
	must(t, f.s.Write(sb, Rollback{Target: delta.ID{2}, Processes: true}))
	must(t, f.s.Abandon(ctx, "s", st))
	if len(root.restored) != 1 || root.restored[0] != head.FSTree || len(f.heads) != 1 || f.heads[0] != head.ID || f.procs.stops != 1 {
		t.Fatalf("restored %v, heads %v, stops %d", root.restored, f.heads, f.procs.stops)
	}
	if in := f.s.Interrupted(sb); in == nil || in.Rollback != nil || !strings.Contains(in.ProcessesLost, "abandoned") {
		t.Fatalf("interrupted %+v", in)
	}
}
