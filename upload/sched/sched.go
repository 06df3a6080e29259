// Package sched is the host-wide upload scheduler: one queue for the
// uploads of every sandbox on a host, sent to one Store under a concurrency
// limit and a bandwidth cap, with fair shares between sandboxes and an
// urgent lane.
//
// Lifecycle: New starts the workers. Submit queues an upload and returns a
// Ticket at once; the upload runs when a worker is free and its sandbox's
// turn comes; Ticket.Wait (or Wait for a set, such as all objects of one
// checkpoint) blocks until it is stored. Close stops taking uploads and
// drains the queue.
//
// Fairness: uploads wait in two lanes, urgent and normal, each a deficit
// round robin by bytes over sandboxes (see drr). A worker always takes from
// the urgent lane first, and while an urgent upload is running the normal
// ones pause their reads, so the whole bandwidth goes to what someone is
// waiting for. Promote moves a sandbox's waiting uploads to the urgent lane
// (`turnsnap checkpoint --wait-remote`).
//
// Retries are not the scheduler's business: give it a Store wrapped with
// upload.WithRetry, and Open functions returning an io.Seeker (an *os.File)
// so a retry can rewind the body instead of buffering it.
package sched

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Config sets up a Scheduler. Only Store is required.
type Config struct {
	// Store receives every upload.
	Store upload.Store
	// Concurrency is how many uploads run at once; 0 means 4. On S3 one
	// upload rarely fills a link (one TCP stream, a round trip per
	// request), and four keep a 16 MiB-pack stream busy without holding
	// more than four part buffers.
	Concurrency int
	// UrgentSlots are extra workers that only take urgent uploads, so an
	// upload someone waits on starts at once even while Concurrency long
	// ones are running; 0 means 1, negative means none.
	UrgentSlots int
	// BytesPerSec caps the bytes read from upload bodies, host-wide, over
	// all workers; 0 means no cap.
	BytesPerSec int64
	// Quantum is the deficit round robin's quantum in bytes; 0 means 1 MiB.
	// Smaller is finer interleaving, larger is less bookkeeping.
	Quantum int64
	// Logger gets a line per failed upload; nil means slog.Default().
	Logger *slog.Logger
}

// Upload is one object to store.
type Upload struct {
	// Sandbox is whose upload it is: the unit of fair sharing.
	Sandbox string
	// Name and Size are passed to Store.Put.
	Name string
	Size int64
	// Open returns the body, positioned at its start; it is called once per
	// run, when a worker takes the upload, so nothing is held open while it
	// waits. The scheduler closes what it returns.
	Open func() (io.ReadCloser, error)
	// Urgent puts the upload in the urgent lane.
	Urgent bool
	// After lists uploads that must be stored before this one starts, such
	// as a checkpoint's packs before its record: nothing refers to an
	// object the bucket does not have yet. If one of them fails, this
	// upload fails without running.
	After []*Ticket
}

// Scheduler runs uploads; see the package comment. It is safe for
// concurrent use.
type Scheduler struct {
	cfg     Config
	log     *slog.Logger
	limiter *rate.Limiter // nil: no cap
	chunk   int           // largest read, within the limiter's burst

	base  context.Context // cancelled by an aborted Close
	abort context.CancelFunc

	mu      sync.Mutex
	cond    *sync.Cond         // signalled when an upload is queued or the scheduler closes
	lanes   [2]*drr            // laneNormal, laneUrgent
	blocked map[*item]struct{} // uploads waiting for their After
	running map[*item]struct{}
	flows   map[string]*sandboxCount
	closed  bool
	total   totals

	gate    gate
	meter   meter
	workers sync.WaitGroup
	deps    sync.WaitGroup
}

const (
	laneNormal = 0
	laneUrgent = 1
)

// item is one submitted upload.
type item struct {
	u      Upload
	t      *Ticket
	ctx    context.Context
	cancel context.CancelFunc
	urgent atomic.Bool  // may change while running (Promote)
	sent   atomic.Int64 // body bytes handed to the store in the current run
	gated  bool         // holds the urgent gate; guarded by Scheduler.mu
}

// New starts a Scheduler's workers.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("upload scheduler: no store: %w", errdefs.ErrInvalid)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.UrgentSlots == 0 {
		cfg.UrgentSlots = 1
	}
	if cfg.Quantum <= 0 {
		cfg.Quantum = 1 << 20
	}
	s := &Scheduler{
		cfg:     cfg,
		log:     cfg.Logger,
		chunk:   64 << 10,
		running: map[*item]struct{}{},
		blocked: map[*item]struct{}{},
		flows:   map[string]*sandboxCount{},
		lanes:   [2]*drr{newDRR(cfg.Quantum), newDRR(cfg.Quantum)},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.BytesPerSec > 0 {
		// A tenth of a second of burst: smooth enough that a measured
		// second is within a few percent of the cap, large enough that a
		// slow cap still moves whole 64 KiB reads.
		burst := max(int(cfg.BytesPerSec/10), s.chunk)
		s.limiter = rate.NewLimiter(rate.Limit(cfg.BytesPerSec), burst)
	}
	s.cond = sync.NewCond(&s.mu)
	s.base, s.abort = context.WithCancel(context.Background())
	for range cfg.Concurrency {
		s.workers.Go(func() { s.work(false) })
	}
	for range max(cfg.UrgentSlots, 0) {
		s.workers.Go(func() { s.work(true) })
	}
	return s, nil
}

// Submit queues u and returns its Ticket. ctx bounds the upload's whole
// life, not only the call: when it ends, a waiting upload is dropped and a
// running one is aborted, and the Ticket reports ctx's error.
func (s *Scheduler) Submit(ctx context.Context, u Upload) (*Ticket, error) {
	what := fmt.Sprintf("upload %s of sandbox %s", u.Name, u.Sandbox)
	if err := upload.CheckName(u.Name); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if u.Size < 0 || u.Open == nil {
		return nil, fmt.Errorf("%s: negative size or no Open: %w", what, errdefs.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	it := &item{u: u, t: newTicket(u)}
	it.urgent.Store(u.Urgent)
	it.ctx, it.cancel = context.WithCancel(ctx)

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		it.cancel()
		return nil, fmt.Errorf("%s: the scheduler is closed: %w", what, errdefs.ErrPrecondition)
	}
	s.count(it, +1)
	stopAbort := context.AfterFunc(s.base, it.cancel)
	context.AfterFunc(it.ctx, func() { stopAbort(); s.dropIfQueued(it) })
	if len(u.After) > 0 {
		s.blocked[it] = struct{}{}
		s.deps.Go(func() { s.awaitDeps(it) })
		return it.t, nil
	}
	s.enqueue(it)
	return it.t, nil
}

// enqueue puts it in its lane; s.mu is held.
func (s *Scheduler) enqueue(it *item) {
	lane := laneNormal
	if it.urgent.Load() {
		lane = laneUrgent
	}
	s.lanes[lane].push(it)
	s.cond.Broadcast()
}

// awaitDeps waits for it's After uploads, then queues it or fails it.
func (s *Scheduler) awaitDeps(it *item) {
	var err error
	for _, dep := range it.u.After {
		if err = dep.Wait(it.ctx); err != nil {
			if it.ctx.Err() == nil {
				err = fmt.Errorf("depends on %s, which failed: %w", dep.Name, err)
			}
			break
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.blocked, it)
	if err != nil {
		s.finishLocked(it, err)
		s.cond.Broadcast()
		return
	}
	s.enqueue(it)
}

// Promote moves the uploads of sandbox that have not started yet to the
// urgent lane, including those still waiting for their After, and lets
// its running uploads take the whole bandwidth. Uploads submitted later
// are not affected. It returns how many uploads it promoted.
func (s *Scheduler) Promote(sandbox string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	moved := s.lanes[laneNormal].take(sandbox)
	for _, it := range moved {
		it.urgent.Store(true)
		s.lanes[laneUrgent].push(it)
	}
	n := len(moved)
	for it := range s.running {
		if it.u.Sandbox == sandbox && !it.urgent.Load() {
			it.urgent.Store(true)
			it.gated = true
			s.gate.enter()
			n++
		}
	}
	for it := range s.blocked {
		if it.u.Sandbox == sandbox && !it.urgent.Load() {
			it.urgent.Store(true) // enqueue will put it in the urgent lane
			n++
		}
	}
	s.cond.Broadcast()
	return n
}

// Close stops accepting uploads and waits until every submitted one has
// finished. If ctx ends first, it aborts the rest (their Tickets report
// context.Canceled), waits for the workers to stop, and returns ctx's error.
func (s *Scheduler) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.deps.Wait()
		s.workers.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.abort()
		return nil
	case <-ctx.Done():
		s.abort()
		<-done
		return fmt.Errorf("upload scheduler: closing: %w", ctx.Err())
	}
}
