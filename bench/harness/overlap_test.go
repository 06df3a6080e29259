package harness

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A checkpoint shorter than the model latency is hidden (no gate delay);
// a longer one delays the next turn by what the latency did not cover; a
// failed checkpoint fails the boundary; no checkpoint is the latency alone.
func TestTurnBoundary(t *testing.T) {
	ctx := context.Background()
	var during atomic.Bool
	start := time.Now()
	b, err := turnBoundary(ctx, 300*time.Millisecond, func(context.Context) error {
		during.Store(time.Since(start) < 300*time.Millisecond) // it runs while the model thinks
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	took := time.Since(start)
	if err != nil || !b.Overlapped || !during.Load() || b.Exposed != 0 || b.Ckpt < 20*time.Millisecond {
		t.Fatalf("a short checkpoint: %+v, %v, during the latency %v", b, err, during.Load())
	}
	if took < 300*time.Millisecond {
		t.Fatalf("the boundary returned after %v, before the model latency ended", took)
	}

	start = time.Now()
	b, err = turnBoundary(ctx, 50*time.Millisecond, func(context.Context) error {
		time.Sleep(400 * time.Millisecond)
		return nil
	})
	took = time.Since(start)
	if err != nil || !b.Overlapped || b.Exposed < 300*time.Millisecond || b.Exposed > b.Ckpt || took < 400*time.Millisecond {
		t.Fatalf("a long checkpoint: %+v, %v, took %v (want the gate to hold ~350 ms past the latency)", b, err, took)
	}

	boom := errors.New("boom")
	if _, err := turnBoundary(ctx, time.Millisecond, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("a failed checkpoint: %v", err)
	}
	start = time.Now()
	if b, err := turnBoundary(ctx, 30*time.Millisecond, nil); err != nil || b != (boundary{}) || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("no checkpoint: %+v %v", b, err)
	}
}
