package engine

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/overlay/frozen"
)

// TestFreezeWaitsForIdleUnlessNeeded: while another sandbox's checkpoint
// is in flight (held in its scan), a finished checkpoint's freeze does not
// start; a branch of a later checkpoint of that sandbox does not wait for
// idle (it rushes the earlier freeze it builds on and stacks on its
// layer), nor does WaitFreezes; and the held checkpoint then completes.
func TestFreezeWaitsForIdleUnlessNeeded(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	overlayOf(e).Keeper().SetMaxDefer(time.Hour) // only idle or a rush can start a freeze
	base := richBase(t)
	ca, err := e.CreateSandbox(ctx, "a", CreateOptions{Base: base})
	must(t, err)
	cb, err := e.CreateSandbox(ctx, "b", CreateOptions{Base: base})
	must(t, err)
	e.WaitFreezes()
	var armed atomic.Bool
	var started atomic.Int64
	inScan, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // a failing test still lets the held turn end (Close waits for it)
	e.opts.AtPhase = func(p string) {
		switch {
		case p == PhaseScan && armed.CompareAndSwap(true, false):
			close(inScan)
			<-release
		case p == frozen.PhaseStart:
			started.Add(1)
		}
	}
	write(t, filepath.Join(ca.Root, "a.txt"), "a\n")
	armed.Store(true)
	aDone := make(chan error, 1)
	go func() {
		_, err := e.Checkpoint(ctx, "a", CheckpointOptions{})
		aDone <- err
	}()
	<-inScan // a's turn is in flight from here on

	turn := func(content string) string {
		t.Helper()
		write(t, filepath.Join(cb.Root, "work", content), content)
		r, err := e.Checkpoint(ctx, "b", CheckpointOptions{})
		must(t, err)
		return r.ID.String()
	}
	turn("one")
	time.Sleep(100 * time.Millisecond) // a freeze that ignored the turn in flight would start here
	if n := started.Load(); n != 0 {
		t.Fatalf("%d freezes started while a turn was in flight", n)
	}
	c2 := turn("two") // queued behind the first freeze, which waits for idle
	type result struct {
		root string
		err  error
	}
	br := make(chan result, 1)
	go func() {
		r, err := e.Branch(ctx, mustRef(c2), "br", BranchOptions{})
		if err != nil {
			br <- result{err: err}
			return
		}
		br <- result{root: r.Root}
	}()
	var res result
	select {
	case res = <-br:
		must(t, res.err)
	case <-time.After(time.Minute):
		t.Fatal("the branch waited for the engine to be idle")
	}
	cp2, err := e.resolveFor(ctx, "", mustRef(c2))
	must(t, err)
	if got := overlay.FrozenUser(e.home.sandboxDir("br")); got != overlayOf(e).Layers().Dir(cp2.FSTree) {
		t.Fatalf("the branch stacks on %q, want its checkpoint's layer", got)
	}
	if mergedState(t, res.root) != mergedState(t, cb.Root) {
		t.Fatal("the branch differs from its checkpoint")
	}
	c3 := turn("three")
	drained := make(chan struct{})
	go func() { e.WaitFreezes(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Minute):
		t.Fatal("WaitFreezes waited for the engine to be idle")
	}
	cp3, err := e.resolveFor(ctx, "", mustRef(c3))
	must(t, err)
	if !overlayOf(e).Layers().Has(cp3.FSTree) {
		t.Fatal("WaitFreezes returned before the pending freeze was built")
	}
	select {
	case err := <-aDone:
		t.Fatalf("the held turn finished early: %v", err)
	default:
	}
	letGo()
	must(t, <-aDone)
	e.WaitFreezes()
	must(t, e.RemoveSandbox(ctx, "br"))
	checkAll(t, e)
}
