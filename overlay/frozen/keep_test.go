package frozen_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
)

// catalogLines is a catalog of one line per sandbox, in memory
// (frozen.Lines).
type catalogLines struct {
	cps   map[delta.ID]*delta.Checkpoint
	heads map[string]delta.ID
}

func (l *catalogLines) SandboxNames() ([]delta.SandboxName, error) {
	var out []delta.SandboxName
	for n := range l.heads {
		out = append(out, delta.SandboxName(n))
	}
	return out, nil
}

func (l *catalogLines) GetRef(_ delta.RefKind, name string) (delta.ID, error) {
	if id, ok := l.heads[name]; ok {
		return id, nil
	}
	return delta.ID{}, errdefs.ErrNotFound
}

func (l *catalogLines) Checkpoint(id delta.ID) (*delta.Checkpoint, error) {
	if cp, ok := l.cps[id]; ok {
		return cp, nil
	}
	return nil, errdefs.ErrNotFound
}

func (l *catalogLines) Ancestors(id delta.ID, limit int) ([]*delta.Checkpoint, error) {
	var out []*delta.Checkpoint
	for !id.IsZero() && len(out) < limit {
		cp, err := l.Checkpoint(id)
		if err != nil {
			return out, err
		}
		out = append(out, cp)
		id = cp.Parent
	}
	return out, nil
}

// keeperFixture is a Keeper over real layers in a temporary directory, one
// sandbox "s" whose live upper is a plain directory, and a memory store.
type keeperFixture struct {
	k     *frozen.Keeper
	live  string
	store *roottest.MemStore
	lines *catalogLines
	phase func(string) // the Keeper's Deps.Phase calls it if set
	mu    sync.Mutex
}

func newKeeperFixture(t *testing.T) *keeperFixture {
	testenv.RequireRoot(t)
	f := &keeperFixture{store: roottest.NewMemStore(),
		lines: &catalogLines{cps: map[delta.ID]*delta.Checkpoint{}, heads: map[string]delta.ID{}}}
	sandboxes := t.TempDir()
	f.live = filepath.Join(sandboxes, "s", "upper")
	if err := os.MkdirAll(f.live, 0o755); err != nil {
		t.Fatal(err)
	}
	f.k = frozen.NewKeeper(frozen.Deps{
		Layers: frozen.NewLayers(t.TempDir(), overlay.Translate),
		Keep:   func() int { return frozen.DefaultKeep },
		Loader: func() delta.BlobLoader { return f.store },
		View:   func(_ context.Context, fn func(frozen.Lines) error) error { return fn(f.lines) },
		Room:   func(uint64) error { return nil },
		Phase: func(p string) {
			f.mu.Lock()
			fn := f.phase
			f.mu.Unlock()
			if fn != nil {
				fn(p)
			}
		},
		Sandboxes: sandboxes,
		LiveUpper: func(dir string) (string, error) { return filepath.Join(dir, "upper"), nil },
		StackedOn: func(string) string { return "" },
	})
	t.Cleanup(f.k.Close)
	return f
}

// commit records the live upper's state as sandbox s's next checkpoint.
func (f *keeperFixture) commit(t *testing.T, content string) *delta.Checkpoint {
	t.Helper()
	roottest.Write(t, filepath.Join(f.live, "work", "notes.txt"), content)
	tree := scanUpper(t, f.live, f.store)
	cp := &delta.Checkpoint{ID: delta.Hash([]byte(content + tree.String())), Sandbox: "s", FSTree: tree,
		Parent: f.lines.heads["s"], Created: time.Now()}
	f.lines.cps[cp.ID], f.lines.heads["s"] = cp, cp.ID
	return cp
}

// TestKeeperFreezesInTheBackground: a queued freeze builds the
// checkpoint's layer (exact: it verifies), and a branch may stack on it.
func TestKeeperFreezesInTheBackground(t *testing.T) {
	ctx := context.Background()
	f := newKeeperFixture(t)
	cp := f.commit(t, "one\n")
	f.k.FreezeLater("s", delta.ID{}, cp)
	f.k.WaitFreezes()
	if ok, err := f.k.Layers().Verify(ctx, cp.FSTree); !ok || err != nil {
		t.Fatalf("the checkpoint's layer: kept %v, %v", ok, err)
	}
	if err := f.k.AwaitLayer(ctx, cp); err != nil {
		t.Fatalf("a branch may not stack on the layer: %v", err)
	}
	if stacks, err := f.k.PrepareBranch(ctx, cp, 0); !stacks || err != nil {
		t.Fatalf("PrepareBranch: %v, %v", stacks, err)
	}
}

// TestKeeperCloseCancelsAFreeze: Close during a background freeze cancels
// it and waits for it: it returns once the freeze has stopped, and leaves
// neither the layer nor a half-built one behind.
func TestKeeperCloseCancelsAFreeze(t *testing.T) {
	f := newKeeperFixture(t)
	cp := f.commit(t, "one\n")
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.mu.Lock()
	f.phase = func(p string) {
		if p == frozen.PhaseStart {
			once.Do(func() { close(started) })
			<-release
		}
	}
	f.mu.Unlock()
	f.k.FreezeLater("s", delta.ID{}, cp)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the freeze never started")
	}
	closed := make(chan struct{})
	go func() {
		f.k.Close()
		close(closed)
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-closed:
		t.Fatal("Close returned while a freeze was running")
	default:
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after the freeze was cancelled")
	}
	if f.k.Layers().Has(cp.FSTree) {
		t.Fatal("a freeze cancelled at its start published its layer")
	}
	if left, _ := filepath.Glob(filepath.Join(f.k.Layers().Top(), ".tmp-*")); len(left) != 0 {
		t.Fatalf("a cancelled freeze left %v", left)
	}
	// Closed: a freeze queued now never runs.
	cp2 := f.commit(t, "two\n")
	f.k.FreezeLater("s", cp.FSTree, cp2)
	f.k.WaitFreezes()
	if f.k.Layers().Has(cp2.FSTree) {
		t.Fatal("a closed keeper froze a layer")
	}
}
