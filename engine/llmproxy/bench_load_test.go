package llmproxy

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine"
)

// BenchmarkGateModel20msLoaded is BenchmarkGateModel20ms with other
// sandboxes of the same engine taking 10-file fs turns back to back while
// the measured agent runs: the exposed delay is still the checkpoint's
// remaining time, which the load lengthens. (Checkpoints of different
// sandboxes run side by side; the engine has no checkpoint scheduler lane
// to promote them to, so Turn.Urgent only speeds the remote gate's upload.)
// With TURNSNAP_BENCH_SMALL=1 one loader runs instead of two.
func BenchmarkGateModel20msLoaded(b *testing.B) {
	e, agentTurn := fsTurnEngine(b)
	loaders := 2
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
		res, err := e.CreateSandbox(ctx, name, engine.CreateOptions{Base: base})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.RemoveSandbox(context.Background(), name) })
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
				if _, err := e.Checkpoint(ctx, name, engine.CheckpointOptions{}); err == nil {
					loadTurns.Add(1)
				}
			}
		}()
	}
	b.Cleanup(func() { cancel(); wg.Wait() })
	exposed, remaining := gateRunOn(b, e, agentTurn, 20*time.Millisecond)
	cancel()
	wg.Wait()
	if loadTurns.Load() == 0 {
		b.Fatal("the loaders took no checkpoint: no load was measured")
	}
	excess := make([]time.Duration, len(exposed))
	for i := range exposed {
		excess[i] = exposed[i] - remaining[i]
	}
	reportPct(b, "exposed", exposed)
	reportPct(b, "ckpt-remaining", remaining)
	reportPct(b, "excess", excess)
	b.ReportMetric(float64(loadTurns.Load())/float64(b.N), "load-turns/op")
}
