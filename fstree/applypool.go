package fstree

import (
	"context"
	"fmt"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
)

// filePool writes the files of an upper-form apply (ApplyOptions.Workers)
// beside the walk, which goes on making directories, symlinks and the
// other entries in tree order. A directory's metadata is set only once
// its own files are done (dirFiles.wait), and a hardlink waits for every
// file in flight (its target may be one), so the result is the
// sequential apply's.
type filePool struct {
	tasks    chan fileTask
	workers  sync.WaitGroup
	inflight sync.WaitGroup // every file queued and not done; only the walk adds and waits
	mu       sync.Mutex
	err      error // the first file's error
}

type fileTask struct {
	dirFD int
	rel   string
	e     *delta.Entry
	dir   *sync.WaitGroup // the directory's files
}

// newFilePool starts n workers writing files through a.
func newFilePool(ctx context.Context, a *applier, n int) *filePool {
	p := &filePool{tasks: make(chan fileTask, 2*n)}
	for range n {
		p.workers.Add(1)
		go func() {
			defer p.workers.Done()
			for t := range p.tasks {
				if p.failed() == nil {
					if err := a.file(ctx, t.dirFD, t.rel, t.e); err != nil {
						p.fail(fmt.Errorf("restore %s:/%s: %w", a.root, t.rel, err))
					}
				}
				t.dir.Done()
				p.inflight.Done()
			}
		}()
	}
	return p
}

// queue hands file e (at rel, in the directory dirFD) to a worker; dir
// counts the directory's files, which the walk waits for before it sets
// the directory's metadata or closes dirFD.
func (p *filePool) queue(dirFD int, rel string, e *delta.Entry, dir *sync.WaitGroup) error {
	if err := p.failed(); err != nil {
		return err
	}
	dir.Add(1)
	p.inflight.Add(1)
	p.tasks <- fileTask{dirFD: dirFD, rel: rel, e: e, dir: dir}
	return nil
}

// drain waits for every file in flight and returns the first error.
func (p *filePool) drain() error {
	p.inflight.Wait()
	return p.failed()
}

// close stops the workers once the walk is done (or failed).
func (p *filePool) close() error {
	close(p.tasks)
	p.workers.Wait()
	return p.failed()
}

func (p *filePool) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

func (p *filePool) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
