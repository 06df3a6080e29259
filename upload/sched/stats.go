package sched

import (
	"context"
	"sync"
	"time"
)

// Stats is a snapshot of the scheduler, for `turnsnap status` and metrics.
type Stats struct {
	// Queued uploads wait for a worker, Urgent of them in the urgent lane;
	// Blocked ones wait for their After; Running ones are being sent.
	Queued, Urgent, Blocked, Running int
	// PendingBytes are the bytes of every unfinished upload not yet sent.
	PendingBytes int64
	// BytesPerSec is the rate bodies were read at over the last few seconds.
	BytesPerSec float64
	// SentBytes counts every body byte read since New, resent ones too.
	SentBytes int64
	// Completed and Failed count finished uploads since New.
	Completed, Failed int64
	// Sandboxes has an entry for each sandbox with unfinished uploads.
	Sandboxes map[string]SandboxStats
}

// SandboxStats is one sandbox's unfinished uploads.
type SandboxStats struct {
	// Uploads submitted and not yet finished, and their bytes not yet sent.
	Uploads      int
	PendingBytes int64
}

// totals are the counts kept since New.
type totals struct {
	completed, failed int64
}

// Stats returns a snapshot.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Queued:    s.lanes[laneNormal].n + s.lanes[laneUrgent].n,
		Urgent:    s.lanes[laneUrgent].n,
		Blocked:   len(s.blocked),
		Running:   len(s.running),
		Completed: s.total.completed,
		Failed:    s.total.failed,
		Sandboxes: make(map[string]SandboxStats, len(s.flows)),
	}
	for name, c := range s.flows {
		st.Sandboxes[name] = SandboxStats{Uploads: c.uploads, PendingBytes: c.bytes}
	}
	for it := range s.running {
		sb := st.Sandboxes[it.u.Sandbox]
		sb.PendingBytes -= min(it.sent.Load(), it.u.Size)
		st.Sandboxes[it.u.Sandbox] = sb
	}
	for _, sb := range st.Sandboxes {
		st.PendingBytes += sb.PendingBytes
	}
	st.SentBytes, st.BytesPerSec = s.meter.read(time.Now())
	return st
}

// meterWindow is how far back BytesPerSec looks: long enough to smooth
// over one large object's start and end, short enough to follow a change.
const meterWindow = 5 * time.Second

// meter counts bytes in one-second buckets.
type meter struct {
	mu      sync.Mutex
	total   int64
	first   time.Time // of the first byte
	buckets [8]struct {
		sec   int64
		bytes int64
	}
}

func (m *meter) add(n int64) {
	now := time.Now()
	sec := now.Unix()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.first.IsZero() {
		m.first = now
	}
	m.total += n
	b := &m.buckets[sec%int64(len(m.buckets))]
	if b.sec != sec {
		b.sec, b.bytes = sec, 0
	}
	b.bytes += n
}

// read returns the total and the rate over the last meterWindow.
func (m *meter) read(now time.Time) (int64, float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.first.IsZero() {
		return 0, 0
	}
	secs := int64(meterWindow / time.Second)
	var sum int64
	for _, b := range m.buckets {
		if b.sec > now.Unix()-secs && b.sec <= now.Unix() {
			sum += b.bytes
		}
	}
	// The window is the last secs-1 whole seconds plus the current one's
	// elapsed part, or less if the first byte came later than that.
	span := time.Duration(secs-1)*time.Second + time.Duration(now.Nanosecond())
	span = min(span, now.Sub(m.first))
	if span <= 0 {
		return m.total, 0
	}
	return m.total, float64(sum) / span.Seconds()
}

// gate holds normal uploads' reads while any urgent upload runs.
type gate struct {
	mu     sync.Mutex
	urgent int
	open   chan struct{} // closed when urgent drops to 0
}

func (g *gate) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.urgent == 0 {
		g.open = make(chan struct{})
	}
	g.urgent++
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.urgent--; g.urgent == 0 {
		close(g.open)
	}
}

// wait returns when no urgent upload runs, or ctx's error.
func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	if g.urgent == 0 {
		g.mu.Unlock()
		return nil
	}
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
