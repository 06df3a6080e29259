package fstree

import (
	"context"
	"github.com/turnsnap/turnsnap/delta"
	"sync"
	"sync/atomic"
)

// The ingest pipeline. The scanning goroutine reads and cuts (FastCDC is
// sequential by nature: a cut depends on the bytes before it) and submits
// each chunk; workers hash it and let the saver prepare it (compression,
// BlobPreparer); one saving goroutine passes the chunks, and the trees
// submitted between them, to SaveBlob strictly in submission order. So the
// saver sees exactly the calls a single worker makes, and trees, IDs and
// packs are byte-identical to the serial path. Memory is bounded: at most
// inFlight chunks (each at most ChunkMax bytes plus its compressed copy)
// are between the scanner and the saver; a scanner that gets ahead waits.

// BlobPreparer is an optional interface of a BlobSaver. PrepareBlob does,
// on any goroutine and ahead of time, the part of saving plain that does
// not depend on order (compressing it), so that the SaveBlob of the same
// blob, made later and in order, only appends it. It must be safe for
// concurrent use and must not keep plain. A saver that wraps another
// forwards it with Prepare.
type BlobPreparer interface {
	PrepareBlob(ctx context.Context, t delta.BlobType, id delta.ID, plain []byte)
}

// Prepare calls s's PrepareBlob if it has one.
func Prepare(ctx context.Context, s delta.BlobSaver, t delta.BlobType, id delta.ID, plain []byte) {
	if p, ok := s.(BlobPreparer); ok {
		p.PrepareBlob(ctx, t, id, plain)
	}
}

// job is one blob on its way through the pipeline.
type job struct {
	t      delta.BlobType
	id     delta.ID
	data   []byte
	hashed bool          // id is known at submission (trees)
	claim  atomic.Bool   // set by whoever hashes and prepares it: a worker, or the scanner
	idSet  chan struct{} // closed when id is set
	done   chan struct{} // closed when the blob is also prepared
	pooled bool          // data came from the pipeline's pool
}

// process hashes and prepares j unless someone else already claimed it.
func (p *pipeline) process(j *job) {
	if !j.claim.CompareAndSwap(false, true) {
		return
	}
	j.id = p.scheme.Hash(j.data)
	close(j.idSet)
	// Preparing is an optimisation that never fails; what it skips, SaveBlob does.
	Prepare(context.Background(), p.saver, j.t, j.id, j.data)
	close(j.done)
}

type pipeline struct {
	scheme delta.IDs
	saver  delta.BlobSaver
	work   chan *job // to the workers
	order  chan *job // to the saver, in submission order
	wg     sync.WaitGroup
	saved  chan struct{} // closed when the saving goroutine ends
	pool   sync.Pool
	mu     sync.Mutex
	err    error // the first save error
}

// maxInFlight bounds the chunks between scanner and saver (each holds a
// ChunkMax buffer and its compressed copy: at most 64 MiB). It must cover
// a pack write (16 MiB, tens of milliseconds on a busy disk) so that the
// scanner and the workers go on while the saver writes, and absorb the
// stalls of a machine whose cores are shared: with a short queue, one
// stage descheduled stops the others, and the pipeline ran slower than a
// single goroutine on a loaded 2-core machine (measured).
const maxInFlight = 128

// startPipeline starts the workers and the saver; ctx is the scan's, and
// the saver's SaveBlob calls run under it.
func startPipeline(ctx context.Context, ids delta.IDs, saver delta.BlobSaver, workers int) *pipeline {
	n := max(maxInFlight, 4*workers)
	p := &pipeline{scheme: ids, saver: saver, work: make(chan *job, n), order: make(chan *job, n), saved: make(chan struct{})}
	p.pool.New = func() any { b := make([]byte, 0, delta.ChunkMax); return &b }
	for range workers {
		p.wg.Add(1)
		go p.worker()
	}
	go p.save(ctx)
	return p
}

func (p *pipeline) copyOf(b []byte) []byte {
	buf := p.pool.Get().(*[]byte)
	return append((*buf)[:0], b...)
}

func (p *pipeline) release(j *job) {
	if cap(j.data) == delta.ChunkMax {
		b := j.data[:0]
		p.pool.Put(&b)
	}
	j.data = nil
}

func (p *pipeline) firstErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// submit queues j behind everything submitted before it. On an error j
// is not queued (or, queued, is already done) and the caller drops it.
func (p *pipeline) submit(ctx context.Context, j *job) error {
	if err := p.firstErr(); err != nil {
		return err
	}
	j.idSet, j.done = make(chan struct{}), make(chan struct{})
	j.pooled = !j.hashed
	if j.hashed {
		j.claim.Store(true)
		close(j.idSet)
		close(j.done)
	}
	select {
	case p.order <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	if j.hashed {
		return nil
	}
	select {
	case p.work <- j:
	case <-ctx.Done():
		// j is queued for the saver, which waits for it: finish it here.
		p.process(j)
		return ctx.Err()
	}
	return nil
}

// ids returns the jobs' IDs, a file's chunks at its end. Rather than wait
// idle for the workers to reach the file's last chunks, the scanner
// processes each job no worker has claimed yet itself: it waits at most
// for the jobs the workers hold at that moment.
func (p *pipeline) ids(ctx context.Context, jobs []*job) ([]delta.ID, error) {
	out := make([]delta.ID, len(jobs))
	for i := len(jobs) - 1; i >= 0; i-- {
		p.process(jobs[i]) // the last are the least likely to be claimed
	}
	for i, j := range jobs {
		<-j.idSet // workers never block, so this ends even if ctx is done
		out[i] = j.id
	}
	return out, ctx.Err()
}

func (p *pipeline) worker() {
	defer p.wg.Done()
	for j := range p.work {
		p.process(j)
	}
}

func (p *pipeline) save(ctx context.Context) {
	defer close(p.saved)
	for j := range p.order {
		<-j.done
		if p.saver != nil && p.firstErr() == nil {
			if _, err := p.saver.SaveBlob(ctx, j.t, j.id, j.data); err != nil {
				p.mu.Lock()
				p.err = err
				p.mu.Unlock()
			}
		}
		if j.pooled {
			p.release(j)
		}
	}
}

// close waits for every queued job and stops the goroutines.
func (p *pipeline) close() error {
	close(p.work)
	close(p.order)
	p.wg.Wait()
	<-p.saved
	return p.firstErr()
}
