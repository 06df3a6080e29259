package llmproxy

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
)

// BenchmarkGateModel20msLoaded is BenchmarkGateModel20ms with other
// sandboxes of the same engine taking 10-file fs turns back to back while
// the measured agent runs: the exposed delay is still the checkpoint's
// remaining time, which the load lengthens.
//
// slots=default is the daemon's engine (engine/admission: GOMAXPROCS
// checkpoints at once, the rest queued). Its calls alternate, in one loop,
// between the urgent lane (when the reply is ready first, the waiting
// checkpoint goes ahead of the loaders' queued ones) and no lane (the
// checkpoint waits its turn in arrival order): lane-* against nolane-*.
// slots=unlimited is the engine with no admission at all, every checkpoint
// running at once as before the scheduler existed.
// With TURNSNAP_BENCH_SMALL=1 one loader runs instead of four.
func BenchmarkGateModel20msLoaded(b *testing.B) {
	b.Run("slots=default", func(b *testing.B) {
		e, agentTurn := fsTurnEngineSlots(b, 0)
		var exposed, remaining []time.Duration
		loaded(b, e, func() {
			exposed, remaining = gateRunLanes(b, e, agentTurn, 20*time.Millisecond, func(i int) bool { return i%2 == 1 })
		})
		var lane, nolane [2][]time.Duration
		for i := range exposed {
			g := &lane
			if i%2 == 1 {
				g = &nolane
			}
			g[0], g[1] = append(g[0], exposed[i]), append(g[1], exposed[i]-remaining[i])
		}
		reportPct(b, "lane-exposed", lane[0])
		reportPct(b, "nolane-exposed", nolane[0])
		reportPct(b, "lane-excess", lane[1])
		reportPct(b, "nolane-excess", nolane[1])
		st := e.Admission().Stats()
		b.ReportMetric(float64(st.Promoted)/float64(b.N), "promoted/op")
	})
	b.Run("slots=unlimited", func(b *testing.B) {
		e, agentTurn := fsTurnEngineSlots(b, -1)
		var exposed, remaining []time.Duration
		loaded(b, e, func() { exposed, remaining = gateRunOn(b, e, agentTurn, 20*time.Millisecond) })
		excess := make([]time.Duration, len(exposed))
		for i := range exposed {
			excess[i] = exposed[i] - remaining[i]
		}
		reportPct(b, "exposed", exposed)
		reportPct(b, "ckpt-remaining", remaining)
		reportPct(b, "excess", excess)
	})
}

// loaded runs measure while loader sandboxes of e take fs turns back to
// back, and reports their turns per measured call.
func loaded(b *testing.B, e *engine.Engine, measure func()) {
	loaders := 4
	if os.Getenv("TURNSNAP_BENCH_SMALL") != "" {
		loaders = 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var loadTurns atomic.Int64
	base := b.TempDir()
	os.WriteFile(filepath.Join(base, "README"), []byte("load\n"), 0o644)
	for l := 0; l < loaders; l++ {
		name := fmt.Sprintf("load%d", l)
		res, err := e.CreateSandbox(ctx, delta.SandboxName(name), engine.CreateOptions{Base: base})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.RemoveSandbox(context.Background(), delta.SandboxName(name)) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for i := 0; ctx.Err() == nil; i++ {
				d := filepath.Join(res.Root, fmt.Sprintf("t%d", i))
				os.MkdirAll(d, 0o755)
				for f := range 10 {
					rand.Read(buf)
					os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", f)), buf, 0o644)
				}
				// Not ctx: a turn in flight when the measurement ends
				// finishes, so it counts as load that overlapped it.
				if _, err := e.Checkpoint(context.Background(), delta.SandboxName(name), engine.CheckpointOptions{}); err == nil {
					loadTurns.Add(1)
				}
			}
		}()
	}
	b.Cleanup(func() { cancel(); wg.Wait() })
	// Measure only once every loader has finished a turn, so the load is
	// running (not starting up) throughout.
	for loadTurns.Load() < int64(loaders) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	before := loadTurns.Load()
	measure()
	cancel()
	wg.Wait()
	during := loadTurns.Load() - before
	if during == 0 {
		b.Fatal("the loaders took no checkpoint during the measurement: no load was measured")
	}
	b.ReportMetric(float64(during)/float64(b.N), "load-turns/op")
}
