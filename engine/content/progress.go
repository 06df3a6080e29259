package content

import (
	"sync"
	"time"
)

// Progress is a snapshot of a long operation's work so far: every blob
// stored or read back counts (imports, checkpoints, restores, verifies).
type Progress struct {
	Blobs   int64
	Bytes   int64 // plaintext bytes
	Elapsed time.Duration
	// Phase names the step under way ("scan", "restore", "upload"), ""
	// when unknown. Total is the bytes the phase will read or write when
	// known (0: unknown) and Done the bytes it has so far.
	Phase string
	Total int64
	Done  int64
}

// progressEvery paces reports: often enough to look alive, rarely enough to
// cost nothing next to the work.
const progressEvery = 200 * time.Millisecond

// Meter counts work and reports it to fn at most every progressEvery. It is
// safe for concurrent use: concurrent operations add to one total.
type Meter struct {
	mu    sync.Mutex
	fn    func(Progress)
	start time.Time
	last  time.Time
	p     Progress
}

// NewMeter returns a meter reporting to fn; nil fn reports nothing.
func NewMeter(fn func(Progress)) *Meter { return &Meter{fn: fn, start: time.Now()} }

func (m *Meter) add(bytes int) {
	if m == nil || m.fn == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Blobs++
	m.p.Bytes += int64(bytes)
	m.p.Done += int64(bytes)
	if now := time.Now(); now.Sub(m.last) >= progressEvery {
		m.last = now
		m.p.Elapsed = now.Sub(m.start)
		m.fn(m.p)
	}
}

// SetPhase starts a phase of the operation; total is the bytes it will
// handle, 0 when unknown. It reports at once, so the phase shows even if
// no blob moves for a while.
func (m *Meter) SetPhase(phase string, total int64) {
	if m == nil || m.fn == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Phase, m.p.Total, m.p.Done = phase, total, 0
	m.last = time.Now()
	m.p.Elapsed = m.last.Sub(m.start)
	m.fn(m.p)
}
