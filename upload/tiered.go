package upload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// tieredStore is the Store NewTiered returns.
type tieredStore struct {
	local, remote Store

	mu       sync.Mutex
	fetching map[string]*fetch // objects being copied from remote to local
}

// fetch is one copy of an object from remote to local, shared by every
// reader that wants the object meanwhile.
type fetch struct {
	done chan struct{}
	err  error
}

// NewTiered returns a Store made of a local store in front of a remote one,
// for a host that may lack objects another host uploaded (restore anywhere):
//
//   - Put writes to local only. The local store is the write-ahead stage;
//     copying objects to remote is the upload scheduler's job.
//   - Get and GetRange read local, and on ErrNotFound copy the whole object
//     from remote into local first (one copy at a time per object, however
//     many readers ask), so later reads, of other blobs in the same pack
//     for instance, are local.
//   - Stat answers from local, else from remote, without copying.
//   - List merges both listings, each name once, in lexical order.
//   - Delete deletes from both.
//
// Reads prefer the local copy, so a mutable object (a ref) that another
// host has since replaced in remote reads as this host last wrote it: read
// such objects from the remote store itself when the latest matters.
func NewTiered(local, remote Store) Store {
	return &tieredStore{local: local, remote: remote, fetching: map[string]*fetch{}}
}

func (t *tieredStore) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	return t.local.Put(ctx, name, r, size)
}

func (t *tieredStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	rc, err := t.local.Get(ctx, name)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return rc, err
	}
	if err := t.fetch(ctx, name); err != nil {
		return nil, err
	}
	return t.local.Get(ctx, name)
}

func (t *tieredStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	rc, err := GetRange(ctx, t.local, name, offset, length)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return rc, err
	}
	if err := t.fetch(ctx, name); err != nil {
		return nil, err
	}
	return GetRange(ctx, t.local, name, offset, length)
}

// fetch copies name from remote to local, or waits for the copy another
// reader started.
func (t *tieredStore) fetch(ctx context.Context, name string) error {
	t.mu.Lock()
	f, ok := t.fetching[name]
	if !ok {
		f = &fetch{done: make(chan struct{})}
		t.fetching[name] = f
		// The copy runs on its own context: a reader that gives up must not
		// fail the copy for the others waiting on it.
		go func() {
			f.err = t.copyIn(context.WithoutCancel(ctx), name)
			t.mu.Lock()
			delete(t.fetching, name)
			t.mu.Unlock()
			close(f.done)
		}()
	}
	t.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return fmt.Errorf("object %s: fetching from the remote store: %w", name, ctx.Err())
	}
}

func (t *tieredStore) copyIn(ctx context.Context, name string) error {
	info, err := t.remote.Stat(ctx, name)
	if err != nil {
		return err
	}
	rc, err := t.remote.Get(ctx, name)
	if err != nil {
		return err
	}
	defer rc.Close()
	// The local Put fails unless exactly info.Size bytes arrive, so a
	// truncated download never becomes a local object.
	if err := t.local.Put(ctx, name, rc, info.Size); err != nil {
		return fmt.Errorf("object %s: copying from the remote store: %w", name, err)
	}
	return nil
}

func (t *tieredStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	info, err := t.local.Stat(ctx, name)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return info, err
	}
	return t.remote.Stat(ctx, name)
}

// List reads the local listing whole (it is fast and names are small),
// then merges it into the remote listing as that streams by.
func (t *tieredStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	var local []ObjectInfo
	if err := t.local.List(ctx, prefix, func(info ObjectInfo) error {
		local = append(local, info)
		return nil
	}); err != nil {
		return err
	}
	// emitLocal passes on the local objects that sort before name.
	emitLocal := func(name string, all bool) error {
		for len(local) > 0 && (all || local[0].Name < name) {
			if err := fn(local[0]); err != nil {
				return err
			}
			local = local[1:]
		}
		return nil
	}
	err := t.remote.List(ctx, prefix, func(info ObjectInfo) error {
		if err := emitLocal(info.Name, false); err != nil {
			return err
		}
		if len(local) > 0 && local[0].Name == info.Name {
			return nil // both have it: the local one comes next
		}
		return fn(info)
	})
	if err != nil {
		return err
	}
	return emitLocal("", true)
}

func (t *tieredStore) Delete(ctx context.Context, name string) error {
	if err := t.remote.Delete(ctx, name); err != nil {
		return err
	}
	return t.local.Delete(ctx, name)
}
