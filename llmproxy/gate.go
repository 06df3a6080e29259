package llmproxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// pending is one checkpoint the proxy started. Its channels close in order:
// local when Checkpoint returned, then remote when the checkpoint is in the
// remote store (or at once when the gate is not remote or the checkpoint
// failed).
type pending struct {
	turn       Turn
	urgent     chan struct{}
	urgentOnce sync.Once
	local      chan struct{}
	remote     chan struct{}
	// Written before local (c, err) and before remote (remoteErr) close.
	c         Committed
	err       error
	remoteErr error
	doneAt    time.Time
}

func (pd *pending) markUrgent() { pd.urgentOnce.Do(func() { close(pd.urgent) }) }

type inflightKey struct {
	sandbox string
	conv    delta.ID
}

// begin starts the checkpoint that closes a turn, or joins the one already
// running for the same conversation (an agent's retry of a call that has not
// been answered yet must not cost a second checkpoint).
func (p *Proxy) begin(sandbox string, req Request) *pending {
	if p.opts.Turns == nil {
		return nil
	}
	key := inflightKey{sandbox, req.Conv}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pd := p.inflight[key]; pd != nil {
		return pd
	}
	urgent := make(chan struct{})
	pd := &pending{
		turn:   Turn{Sandbox: sandbox, Number: req.Turn, Conv: req.Conv, Shape: req.Shape, Urgent: urgent},
		urgent: urgent, local: make(chan struct{}), remote: make(chan struct{}),
	}
	p.inflight[key] = pd
	p.wg.Add(1)
	go p.run(key, pd)
	return pd
}

func (p *Proxy) run(key inflightKey, pd *pending) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.inflight, key)
		p.mu.Unlock()
	}()
	// The previous reply's journal entry belongs to this checkpoint (the
	// agent may send this call the moment it parsed the last event, before
	// the upstream closed the stream): let the recording finish first.
	p.settle(pd.turn.Sandbox, pd.turn.Number)
	start := time.Now()
	pd.c, pd.err = p.opts.Turns.Checkpoint(p.ctx, pd.turn)
	pd.doneAt = time.Now()
	result := "ok"
	if pd.err != nil {
		result = "error"
		p.log.Warn("llm turn checkpoint failed", "sandbox", pd.turn.Sandbox, "turn", pd.turn.Number, "conv", pd.turn.Conv.Short(), "err", pd.err)
	}
	p.m.checkpoint.WithLabelValues(result).Observe(pd.doneAt.Sub(start).Seconds())
	close(pd.local)
	if pd.err == nil && p.opts.Gate == GateRemote {
		pd.remoteErr = p.opts.Turns.WaitRemote(p.ctx, pd.turn, pd.c)
	}
	close(pd.remote)
}

// gateError is a reply held back in strict mode.
type gateError struct {
	sandbox string
	turn    int
	outcome string
	err     error
}

func (e *gateError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("sandbox %s turn %d: checkpoint %s: %v", e.sandbox, e.turn, e.outcome, e.err)
	}
	return fmt.Sprintf("sandbox %s turn %d: checkpoint %s", e.sandbox, e.turn, e.outcome)
}

func (e *gateError) Unwrap() error { return e.err }

// gateEvent describes one held reply, for tests and benchmarks.
type gateEvent struct {
	Sandbox  string
	Ready    time.Time // the upstream's reply head arrived
	Released time.Time
	CkptDone time.Time // zero if the checkpoint had not finished
	Outcome  string
}

// hold is the gate: it returns when the reply may go to the agent, or an
// error for a strict gate whose checkpoint failed or timed out.
func (p *Proxy) hold(ctx context.Context, x *exchange) error {
	pd := x.pend
	if p.opts.Gate == GateNone {
		return nil
	}
	ready := time.Now()
	done := pd.local
	if p.opts.Gate == GateRemote {
		done = pd.remote
	}
	select {
	case <-done:
	default:
		pd.markUrgent() // the reply is ready first: the checkpoint is now urgent
	}
	timer := time.NewTimer(p.opts.GateTimeout)
	defer timer.Stop()
	outcome := "committed"
	var err error
	select {
	case <-done:
		if err = pd.err; err == nil && p.opts.Gate == GateRemote {
			err = pd.remoteErr
		}
		if err != nil {
			outcome = "failed"
		}
	case <-timer.C:
		outcome = "timeout"
	case <-ctx.Done():
		outcome = "client_gone"
	}
	released := time.Now()
	p.m.gateWait.WithLabelValues(string(p.opts.Gate)).Observe(released.Sub(ready).Seconds())
	p.m.gateOutcomes.WithLabelValues(outcome).Inc()
	if p.onGate != nil {
		ev := gateEvent{Sandbox: x.sandbox, Ready: ready, Released: released, Outcome: outcome}
		select {
		case <-pd.local:
			ev.CkptDone = pd.doneAt
		default:
		}
		p.onGate(ev)
	}
	switch outcome {
	case "client_gone":
		return ctx.Err()
	case "failed", "timeout":
		if outcome == "timeout" {
			p.log.Warn("llm gate timed out; releasing the reply", "sandbox", x.sandbox, "turn", pd.turn.Number, "timeout", p.opts.GateTimeout, "strict", p.opts.Strict)
		}
		if p.opts.Strict {
			return &gateError{sandbox: x.sandbox, turn: pd.turn.Number, outcome: outcome, err: err}
		}
	}
	return nil
}

// recorder copies a reply's bytes as the agent receives them and journals
// the exchange once the reply is complete. An incomplete reply (the agent
// hung up, the upstream broke off) or one over MaxJournal is not journaled.
type recorder struct {
	p      *Proxy
	x      *exchange
	resp   *http.Response
	rc     io.ReadCloser
	buf    bytes.Buffer
	over   bool
	once   sync.Once
	closed chan struct{}
}

func (p *Proxy) record(x *exchange, resp *http.Response) {
	r := &recorder{p: p, x: x, resp: resp, rc: resp.Body, closed: make(chan struct{})}
	if resp.ContentLength > p.opts.MaxJournal {
		return
	}
	if resp.ContentLength > 0 {
		r.buf.Grow(int(resp.ContentLength)) // one allocation, kept as the entry's reply
	}
	resp.Body = r
	p.mu.Lock()
	m := p.recording[x.sandbox]
	if m == nil {
		m = map[*recorder]struct{}{}
		p.recording[x.sandbox] = m
	}
	m[r] = struct{}{}
	p.mu.Unlock()
}

func (r *recorder) Read(b []byte) (int, error) {
	n, err := r.rc.Read(b)
	if !r.over {
		if int64(r.buf.Len()+n) > r.p.opts.MaxJournal {
			r.over = true
			r.buf = bytes.Buffer{}
		} else {
			r.buf.Write(b[:n])
		}
	}
	// A reply with a length is complete when its last byte is read; journal
	// it before the agent gets that byte, so its next call finds the entry.
	if err == io.EOF || (r.resp.ContentLength >= 0 && int64(r.buf.Len()) == r.resp.ContentLength && !r.over) {
		r.finish(true)
	}
	return n, err
}

func (r *recorder) Close() error {
	r.finish(false)
	return r.rc.Close()
}

func (r *recorder) finish(complete bool) {
	r.once.Do(func() {
		if complete && !r.over {
			x := r.x
			e := &Entry{Conv: x.req.Conv, Turn: x.req.Turn, Shape: x.req.Shape, Stream: x.req.Stream,
				Status: r.resp.StatusCode, ContentType: r.resp.Header.Get("Content-Type"),
				ContentEncoding: r.resp.Header.Get("Content-Encoding"), Request: x.body, Response: r.buf.Bytes()}
			if err := r.p.opts.Journal.Put(r.p.ctx, x.sandbox, e); err != nil {
				r.p.m.journalErrs.WithLabelValues("put").Inc()
				r.p.log.Warn("llm journal write failed", "sandbox", x.sandbox, "conv", x.req.Conv.Short(), "err", err)
			}
		}
		r.p.mu.Lock()
		delete(r.p.recording[r.x.sandbox], r)
		r.p.mu.Unlock()
		close(r.closed)
	})
}

// settleWait bounds how long a checkpoint waits for the previous reply's
// journal entry: a stream the agent stopped reading ends when the upstream
// closes it, which for real APIs is milliseconds after the last event.
const settleWait = 500 * time.Millisecond

// settle waits for sandbox's replies at position turn-1 that are still
// being journaled: the reply this turn's call continues from. Replies of
// other positions (a concurrent sub-agent's long stream) are not waited for.
func (p *Proxy) settle(sandbox string, turn int) {
	if turn <= 0 {
		return
	}
	p.mu.Lock()
	var chans []chan struct{}
	for r := range p.recording[sandbox] {
		if r.x.req.Turn == turn-1 {
			chans = append(chans, r.closed)
		}
	}
	p.mu.Unlock()
	if len(chans) == 0 {
		return
	}
	t := time.NewTimer(settleWait)
	defer t.Stop()
	for _, c := range chans {
		select {
		case <-c:
		case <-t.C:
			return
		case <-p.ctx.Done():
			return
		}
	}
}
