package lazy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// fetchAheadWorkers bounds the opens a fetch-ahead keeps in flight: enough
// to overlap the bucket's latency, few enough to leave the sandbox's own
// first accesses room.
const fetchAheadWorkers = 4

// FetchAhead fills every pending file, the paths of order first (the
// checkpoint's access record, when there is one) and then the rest from
// the smallest up (many small files are what a first command opens:
// interpreters' modules, configuration), and returns once the layer is
// whole or ctx ends. Each file is filled by opening it by handle: the open
// raises the same event a sandbox's access does, so a file the sandbox
// opens meanwhile is fetched once, by whichever came first.
func (f *Filler) FetchAhead(ctx context.Context, order []string) error {
	f.mu.Lock()
	todo := make([]*pendingFile, 0, len(f.pending))
	for _, p := range f.pending {
		todo = append(todo, p)
	}
	f.mu.Unlock()
	rank := make(map[string]int, len(order))
	for i, r := range order {
		if _, ok := rank[r]; !ok {
			rank[r] = i
		}
	}
	slices.SortFunc(todo, func(a, b *pendingFile) int {
		ra, oka := rank[a.rel]
		rb, okb := rank[b.rel]
		switch {
		case oka && okb:
			return cmp.Compare(ra, rb)
		case oka:
			return -1
		case okb:
			return 1
		}
		return cmp.Or(cmp.Compare(a.entry.Size, b.entry.Size), cmp.Compare(a.rel, b.rel))
	})
	work := make(chan *pendingFile)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range min(fetchAheadWorkers, max(len(todo), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if err := f.touch(p); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for _, p := range todo {
		select {
		case work <- p:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(errs) > 0 {
		// Each error names the sandbox and the file already.
		return fmt.Errorf("%d file(s) not filled: %w", len(errs), errors.Join(errs[:min(len(errs), 3)]...))
	}
	return f.Wait(ctx)
}

// touch opens p by its handle, which fills it (or waits for its fill).
func (f *Filler) touch(p *pendingFile) error {
	fd, err := unix.OpenByHandleAt(int(f.upper.Fd()), p.handle, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK)
	if errors.Is(err, unix.ESTALE) {
		f.forget(p) // removed by the sandbox: nothing left to fill
		return nil
	}
	if err != nil {
		f.mu.Lock()
		ferr := p.err
		f.mu.Unlock()
		if ferr != nil && errors.Is(err, unix.EIO) {
			return ferr // the fill's own error names the object
		}
		return fmt.Errorf("sandbox %s: lazy restore of /%s: %w", f.cfg.Sandbox, p.rel, err)
	}
	return unix.Close(fd)
}

// forget drops a placeholder the sandbox removed before it was filled.
func (f *Filler) forget(p *pendingFile) {
	f.mu.Lock()
	for k, q := range f.pending {
		if q == p && q.busy == nil {
			delete(f.pending, k)
		}
	}
	f.mu.Unlock()
	_ = f.maybeDone()
}
