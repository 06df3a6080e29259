package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/upload/sched"
)

// Pusher pushes the home's upload queue continuously, one push at a time,
// always under its own context. Clients that wait for their objects (sync,
// checkpoint with wait_remote) never run or cancel a push themselves: they
// join the next round, which starts after they asked (so it covers what
// they committed) and which is urgent while anyone waits. A push in flight
// when a waiter arrives runs to its end; the waiter's round then uploads
// what is left. So a waiting client going away costs nothing, and nothing
// is sent twice because someone waited.
type Pusher struct {
	e   *engine.Engine
	mon *Monitor
	log *slog.Logger
	// Retry is the first delay before pushing again after a failed push;
	// it doubles up to a minute.
	Retry time.Duration

	kick chan struct{}
	mu   sync.Mutex
	// waiters are clients waiting for the next round.
	waiters []*waiter
	// durable are committed checkpoints not yet known to be in the bucket.
	durable map[delta.ID]string
}

type waiter struct {
	sandbox string
	done    chan pushResult // buffered: the loop never blocks on a waiter that left
}

type pushResult struct {
	rep *engine.PushReport
	err error
}

// NewPusher makes a pusher for e; Run starts it.
func NewPusher(e *engine.Engine, mon *Monitor, log *slog.Logger) *Pusher {
	return &Pusher{e: e, mon: mon, log: log, Retry: time.Second, kick: make(chan struct{}, 1), durable: map[delta.ID]string{}}
}

// Kick says there may be new work (something was committed or queued).
func (p *Pusher) Kick() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Committed implements Uploader.
func (p *Pusher) Committed(sandbox string, id delta.ID) {
	if !p.e.Remote().HasRemote() {
		return
	}
	p.mu.Lock()
	p.durable[id] = sandbox
	p.mu.Unlock()
	p.Kick()
}

// Wait implements Uploader: it returns the report of the first round that
// started after the call and covered sandbox.
func (p *Pusher) Wait(ctx context.Context, sandbox string) (*engine.PushReport, error) {
	w := &waiter{sandbox: sandbox, done: make(chan pushResult, 1)}
	p.mu.Lock()
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()
	p.Kick()
	select {
	case r := <-w.done:
		return r.rep, r.err
	case <-ctx.Done():
		p.mu.Lock()
		for i, o := range p.waiters {
			if o == w {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				break
			}
		}
		p.mu.Unlock()
		return nil, ctx.Err()
	}
}

// Run pushes until ctx ends: at once (what a killed daemon left queued),
// after every kick, and again after a failure with a growing delay.
func (p *Pusher) Run(ctx context.Context) {
	retry := time.Duration(0)
	timer := time.NewTimer(0) // the first round: resume the queue as it is
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-timer.C:
		}
		err := p.round(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			retry = min(max(2*retry, p.Retry), time.Minute)
			timer.Reset(retry)
			continue
		}
		retry = 0
	}
}

// round runs one push. Its scope is every sandbox, unless every waiter
// waits for one and the same sandbox: then that sandbox's queue (and what
// it depends on) goes first, urgently, and another round follows at once.
func (p *Pusher) round(ctx context.Context) error {
	take := func() []*waiter {
		p.mu.Lock()
		defer p.mu.Unlock()
		ws := p.waiters
		p.waiters = nil
		return ws
	}
	ws := take()
	if !p.e.Remote().HasRemote() && len(ws) == 0 {
		return nil
	}
	if len(ws) == 0 {
		// No one waits for this round: urgent checkpoints go first
		// (engine/admission). Who asks meanwhile joins it; it starts after
		// they asked.
		p.e.Admission().Yield(ctx)
		ws = take()
	}
	scope := ""
	if len(ws) > 0 {
		scope = ws[0].sandbox
		for _, w := range ws {
			if w.sandbox != scope {
				scope = ""
			}
		}
	}
	var last sched.Stats
	var mu sync.Mutex
	var yield func(context.Context)
	if len(ws) == 0 {
		yield = p.e.Admission().Yielder() // and again before each upload
	}
	p.mon.pushStarted()
	rep, err := p.e.Remote().Push(ctx, engine.PushOptions{Sandbox: scope, Urgent: len(ws) > 0, Yield: yield, Progress: func(st sched.Stats) {
		mu.Lock()
		last = st
		mu.Unlock()
	}})
	mu.Lock()
	p.mon.pushed(rep, err, last)
	mu.Unlock()
	for _, w := range ws {
		w.done <- pushResult{rep, err}
	}
	if err != nil && p.e.Remote().HasRemote() {
		p.log.Warn("background push failed; will retry", "err", err)
	} else if rep != nil && rep.Uploaded > 0 {
		p.log.Info("pushed", "uploaded", rep.Uploaded, "bytes", rep.Bytes, "duration", rep.Duration)
	}
	if scope != "" {
		p.Kick() // the rest of the queue
	}
	p.announceDurable(ctx)
	return err
}

// announceDurable publishes remote_durable for the committed checkpoints
// whose records have left the queue.
func (p *Pusher) announceDurable(ctx context.Context) {
	p.mu.Lock()
	n := len(p.durable)
	p.mu.Unlock()
	if n == 0 {
		return
	}
	pending, err := p.e.Remote().PendingCheckpoints(ctx)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, sb := range p.durable {
		if !pending[id] {
			delete(p.durable, id)
			p.mon.remoteDurable(sb, id)
		}
	}
}
