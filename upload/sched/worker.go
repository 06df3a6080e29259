package sched

import (
	"fmt"
	"io"
)

// work runs uploads until the scheduler is closed and idle. An urgentOnly
// worker takes only urgent uploads.
func (s *Scheduler) work(urgentOnly bool) {
	for {
		s.mu.Lock()
		var it *item
		for {
			if it = s.lanes[laneUrgent].pop(); it != nil {
				break
			}
			if !urgentOnly {
				if it = s.lanes[laneNormal].pop(); it != nil {
					break
				}
			}
			if s.closed && s.idleLocked() {
				s.mu.Unlock()
				return
			}
			s.cond.Wait()
		}
		s.running[it] = struct{}{}
		if it.urgent.Load() {
			it.gated = true
			s.gate.enter()
		}
		s.mu.Unlock()

		err := s.run(it)

		s.mu.Lock()
		delete(s.running, it)
		s.finishLocked(it, err)
		if s.closed && s.idleLocked() {
			s.cond.Broadcast() // let the other workers see it too
		}
		s.mu.Unlock()
	}
}

// idleLocked reports whether nothing is queued or waiting; s.mu is held.
func (s *Scheduler) idleLocked() bool {
	return s.lanes[laneNormal].n == 0 && s.lanes[laneUrgent].n == 0 && len(s.blocked) == 0
}

// run stores one upload.
func (s *Scheduler) run(it *item) error {
	if err := it.ctx.Err(); err != nil {
		return err
	}
	rc, err := it.u.Open()
	if err != nil {
		return fmt.Errorf("opening the body: %w", err)
	}
	defer rc.Close()
	body := s.throttle(it, rc)
	return s.cfg.Store.Put(it.ctx, it.u.Name, body, it.u.Size)
}

// finishLocked completes it's Ticket with err and updates the counts;
// s.mu is held. It is called exactly once per item.
func (s *Scheduler) finishLocked(it *item, err error) {
	if it.gated {
		it.gated = false
		s.gate.leave()
	}
	if err != nil {
		err = fmt.Errorf("upload %s of sandbox %s: %w", it.u.Name, it.u.Sandbox, err)
		s.total.failed++
		if it.ctx.Err() == nil {
			s.log.Warn("upload failed", "sandbox", it.u.Sandbox, "object", it.u.Name, "err", err)
		}
	} else {
		s.total.completed++
	}
	s.count(it, -1)
	it.cancel()
	it.t.finish(err)
}

// dropIfQueued fails it with its context's error if it has not started,
// so a cancelled upload leaves the queue (and the counts) at once.
func (s *Scheduler) dropIfQueued(it *item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lanes[laneNormal].remove(it) || s.lanes[laneUrgent].remove(it) {
		s.finishLocked(it, it.ctx.Err())
		s.cond.Broadcast()
	}
}

// sandboxCount is what one sandbox has submitted and not yet finished.
type sandboxCount struct {
	uploads int
	bytes   int64
}

// count adds (delta +1) or removes (-1) it from its sandbox's counts; s.mu
// is held.
func (s *Scheduler) count(it *item, delta int) {
	c := s.flows[it.u.Sandbox]
	if c == nil {
		c = &sandboxCount{}
		s.flows[it.u.Sandbox] = c
	}
	c.uploads += delta
	c.bytes += int64(delta) * it.u.Size
	if c.uploads == 0 {
		delete(s.flows, it.u.Sandbox)
	}
}

// throttle wraps an upload body: reads go at most chunk at a time, wait for
// the bandwidth cap's tokens and, for normal uploads, for the urgent gate,
// and count towards the meter and the upload's progress. If the body can
// seek, so can the wrapper, so that upload.WithRetry rewinds it rather
// than buffering it.
func (s *Scheduler) throttle(it *item, rc io.Reader) io.Reader {
	it.sent.Store(0)
	t := &throttled{s: s, it: it, r: rc}
	if sk, ok := rc.(io.Seeker); ok {
		if start, err := sk.Seek(0, io.SeekCurrent); err == nil {
			return &throttledSeeker{throttled: t, sk: sk, start: start}
		}
	}
	return t
}

type throttled struct {
	s  *Scheduler
	it *item
	r  io.Reader
}

func (t *throttled) Read(p []byte) (int, error) {
	if len(p) > t.s.chunk {
		p = p[:t.s.chunk]
	}
	if !t.it.urgent.Load() {
		if err := t.s.gate.wait(t.it.ctx); err != nil {
			return 0, err
		}
	}
	n, err := t.r.Read(p)
	if n > 0 {
		if t.s.limiter != nil {
			if werr := t.s.limiter.WaitN(t.it.ctx, n); werr != nil {
				return 0, werr
			}
		}
		t.it.sent.Add(int64(n))
		t.s.meter.add(int64(n))
	}
	return n, err
}

type throttledSeeker struct {
	*throttled
	sk    io.Seeker
	start int64
}

// Seek moves the body and the upload's progress with it: bytes sent again
// after a rewind count again, against the cap too, because they cross the
// link again.
func (t *throttledSeeker) Seek(offset int64, whence int) (int64, error) {
	pos, err := t.sk.Seek(offset, whence)
	if err == nil {
		t.it.sent.Store(max(pos-t.start, 0))
	}
	return pos, err
}
