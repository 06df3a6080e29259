package engine

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/faultproxy"
	"github.com/turnsnap/turnsnap/upload"
)

// lockWindow is the stale window the tests' locks promise: short, so a
// killed holder stops blocking within seconds, long enough for a loaded
// 2-core machine to refresh in time.
const lockWindow = 6 * time.Second

// TestHelperStalledPush is not a test: run by TestKilledPushLeavesAStaleLock
// as a child process, it pushes the home named by its environment (whose
// remote stalls every pack upload) until it is killed.
func TestHelperStalledPush(t *testing.T) {
	home := os.Getenv("TURNSNAP_TEST_PUSH_HOME")
	if home == "" {
		t.Skip("helper process only")
	}
	e, err := Open(context.Background(), Options{Home: home})
	must(t, err)
	_, err = e.Remote().Push(context.Background(), PushOptions{})
	t.Fatalf("the stalled push returned: %v", err)
}

// A push SIGKILLed while it holds its bucket lock leaves the lock behind.
// On its own machine the lock is stale at once, though its window has not
// passed: it names this host's boot and a pid that has ended. Another
// home's gc proceeds beside it and `unlock` removes it. (Another machine
// waits for the window: TestKilledGCBlocksOnlyOtherHostsForItsWindow in
// cmd/turnsnap.)
func TestKilledPushLeavesAStaleLock(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	proxy, err := faultproxy.Start("http://"+srv.Endpoint, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "PUT" && strings.Contains(r.Path, "/packs/") {
			return faultproxy.Fault{Kind: faultproxy.Slow, Delay: time.Hour}
		}
		return faultproxy.Fault{}
	})
	must(t, err)
	t.Cleanup(func() { proxy.Close() })

	homeA := filepath.Join(t.TempDir(), "a")
	a := openEngine(t, homeA)
	cr, err := a.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	_, err = a.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	rc := remoteCfg(proxy.Addr, "killed")
	rc.LockStaleAfterNs = int64(lockWindow)
	_, err = a.HomeSetup().Init(ctx, rc)
	must(t, err)
	must(t, a.Close()) // the child takes the home

	b := newEngine(t)
	_, err = b.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "killed"))
	must(t, err)

	child := exec.Command(os.Args[0], "-test.run=^TestHelperStalledPush$", "-test.v")
	child.Env = append(os.Environ(), "TURNSNAP_TEST_PUSH_HOME="+homeA)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	must(t, child.Start())
	// The child holds its lock once the lock object is in the bucket and
	// a pack upload is stalled in the proxy.
	deadline := time.Now().Add(30 * time.Second)
	for proxy.Injected(faultproxy.Slow) == 0 {
		if time.Now().After(deadline) {
			child.Process.Kill()
			t.Fatal("the child push never reached a pack upload")
		}
		time.Sleep(20 * time.Millisecond)
	}
	must(t, child.Process.Kill())
	child.Wait()
	openEngine(t, homeA) // takes the home back, to unmount its sandbox at the end

	locks, err := b.Remote().Locks(ctx)
	must(t, err)
	if len(locks) != 1 || locks[0].Kind != "push" || locks[0].StaleAfter != lockWindow || locks[0].PID != child.Process.Pid {
		t.Fatalf("locks after the kill: %+v", locks)
	}
	if !locks[0].Stale || !locks[0].HolderGone || locks[0].BootID == "" || locks[0].PIDStart == 0 {
		t.Fatalf("the killed push's lock is not stale at once on its own host: %+v", locks[0])
	}
	locks0 := locks[0]
	// unlock removes it at once.
	removed, err := b.Remote().Unlock(ctx, false)
	must(t, err)
	if len(removed) != 1 || removed[0].Name != locks[0].Name {
		t.Fatalf("unlock removed %+v, want the stale lock", removed)
	}
	if locks, _ = b.Remote().Locks(ctx); len(locks) != 0 {
		t.Fatalf("locks left after unlock: %+v", locks)
	}
	// Without unlock, a gc is not blocked by it and removes it as the
	// litter it is.
	data, _ := json.Marshal(locks0.Lock)
	must(t, upload.PutBytes(ctx, b.stores.remote, locks0.Name, data))
	if _, err := b.Retention().GC(ctx, retention.GCOptions{Grace: time.Hour}); err != nil {
		t.Fatalf("gc beside a stale lock: %v", err)
	}
	if locks, _ = b.Remote().Locks(ctx); len(locks) != 0 {
		t.Fatalf("locks left after a gc listed the stale one: %+v", locks)
	}
}

// A holder that cannot refresh its lock cancels its own work before the
// lock can look stale to anyone (restic's rule), whether its refreshes fail
// or hang; `unlock --all` removes a live lock too.
func TestLockHolderThatCannotRefreshCancels(t *testing.T) {
	for _, fault := range []faultproxy.Fault{{Kind: faultproxy.Fail500}, {Kind: faultproxy.Slow, Delay: time.Hour}} {
		t.Run(fault.Kind.String(), func(t *testing.T) { testLockHolderThatCannotRefreshCancels(t, fault) })
	}
}

func testLockHolderThatCannotRefreshCancels(t *testing.T, fault faultproxy.Fault) {
	ctx := context.Background()
	srv := startMinIO(t)
	var failLocks atomic.Bool
	proxy, err := faultproxy.Start("http://"+srv.Endpoint, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "PUT" && strings.Contains(r.Path, "/locks/") && failLocks.Load() {
			return fault
		}
		return faultproxy.Fault{}
	})
	must(t, err)
	t.Cleanup(func() { proxy.Close() })
	e := newEngine(t)
	_, err = e.HomeSetup().Init(ctx, remoteCfg(proxy.Addr, "refresh"))
	must(t, err)
	rs := e.rem.Syncer()
	rs.Remote = upload.WithRetry(mustS3(t, e), upload.RetryPolicy{MaxAttempts: 1})
	rs.LockStaleAfter = 3 * time.Second
	l, err := rs.Lock(ctx, "gc")
	must(t, err)
	lctx, cancel := l.Context(ctx)
	defer cancel()
	start := time.Now()
	failLocks.Store(true)
	select {
	case <-lctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a holder whose refreshes fail kept working")
	}
	// Two thirds of the window after the refresh written by Lock, which
	// is before start; the rest of the window is the margin.
	if el := time.Since(start); el > rs.LockStaleAfter {
		t.Fatalf("cancelled after %s, past the %s window others judge by", el, rs.LockStaleAfter)
	}
	if !errors.Is(context.Cause(lctx), errdefs.ErrUnavailable) || l.Err() == nil {
		t.Fatalf("cause %v", context.Cause(lctx))
	}
	failLocks.Store(false)
	removed, err := e.Remote().Unlock(ctx, true)
	must(t, err)
	if len(removed) != 1 || !strings.HasPrefix(removed[0].Name, delta.LockPrefix+"gc-") {
		t.Fatalf("unlock --all removed %+v", removed)
	}
	l.Release(ctx)
}

func mustS3(t *testing.T, e *Engine) upload.Store {
	t.Helper()
	cfg, err := e.config.Remote.S3Config()
	must(t, err)
	s, err := upload.NewS3(context.Background(), cfg)
	must(t, err)
	return s
}
