package harness

import (
	"context"
	"time"
)

// boundary is one turn boundary as a platform using turnsnap lives it: the
// agent's model call goes out when the turn's commands end, the turn's
// checkpoint starts at that instant and runs while the model thinks (the
// LLM proxy starts it in a goroutine and forwards the call), and the next
// turn's commands wait for the checkpoint to commit: the proxy's gate holds
// the model's reply until then. ckpt nil is a method that takes no
// checkpoint: the boundary is the model latency alone.
type boundary struct {
	Ckpt time.Duration // the checkpoint, start to commit
	// Exposed is how long the gate held the next turn beyond the model
	// latency: the part of the checkpoint the latency did not hide.
	Exposed time.Duration
	// Overlapped: the checkpoint started before the model latency ended
	// (the harness's proof that it did overlap, not a timing guess).
	Overlapped bool
}

// turnBoundary runs ckpt concurrently with the model latency lat and
// returns once both are done.
func turnBoundary(ctx context.Context, lat time.Duration, ckpt func(context.Context) error) (boundary, error) {
	var b boundary
	if ckpt == nil {
		return b, sleep(ctx, lat)
	}
	type done struct {
		started, ended time.Time
		err            error
	}
	ch := make(chan done, 1)
	go func() {
		d := done{started: time.Now()}
		d.err = ckpt(ctx)
		d.ended = time.Now()
		ch <- d
	}()
	serr := sleep(ctx, lat)
	replied := time.Now() // the model's reply reaches the gate
	d := <-ch
	b.Ckpt = d.ended.Sub(d.started)
	b.Exposed = max(d.ended.Sub(replied), 0)
	b.Overlapped = d.started.Before(replied)
	if d.err != nil {
		return b, d.err
	}
	return b, serr
}
