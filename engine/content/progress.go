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
	if now := time.Now(); now.Sub(m.last) >= progressEvery {
		m.last = now
		m.p.Elapsed = now.Sub(m.start)
		m.fn(m.p)
	}
}
