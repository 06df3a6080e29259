package engine

import "time"

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

// meter counts work and reports it to fn at most every progressEvery.
type meter struct {
	fn    func(Progress)
	start time.Time
	last  time.Time
	p     Progress
}

func newMeter(fn func(Progress)) *meter { return &meter{fn: fn, start: time.Now()} }

func (m *meter) add(bytes int) {
	if m == nil || m.fn == nil {
		return
	}
	m.p.Blobs++
	m.p.Bytes += int64(bytes)
	if now := time.Now(); now.Sub(m.last) >= progressEvery {
		m.last = now
		m.p.Elapsed = now.Sub(m.start)
		m.fn(m.p)
	}
}
