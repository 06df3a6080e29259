package remote

import (
	"context"
	"io"
	"sync"

	"github.com/turnsnap/turnsnap/upload"
)

// Lazy returns a store that connects to the remote store on first use (see
// lazyStore).
func Lazy(connect func(context.Context) (upload.Store, error)) upload.Store {
	return &lazyStore{connect: connect}
}

// lazyStore connects to the remote store on first use. Opening a home must
// not need the network: checkpoints commit locally and only uploads, remote
// reads and gc talk to the bucket, so a host that lost its link keeps
// working and catches up later. A failed connection is retried on the next
// call rather than remembered.
type lazyStore struct {
	connect func(context.Context) (upload.Store, error)
	mu      sync.Mutex
	s       upload.Store
}

func (l *lazyStore) get(ctx context.Context) (upload.Store, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != nil {
		return l.s, nil
	}
	s, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	l.s = s
	return s, nil
}

func (l *lazyStore) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Put(ctx, name, r, size)
}

func (l *lazyStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, name)
}

func (l *lazyStore) GetRange(ctx context.Context, name string, off, n int64) (io.ReadCloser, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return upload.GetRange(ctx, s, name, off, n)
}

func (l *lazyStore) Stat(ctx context.Context, name string) (upload.ObjectInfo, error) {
	s, err := l.get(ctx)
	if err != nil {
		return upload.ObjectInfo{}, err
	}
	return s.Stat(ctx, name)
}

func (l *lazyStore) List(ctx context.Context, prefix string, fn func(upload.ObjectInfo) error) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.List(ctx, prefix, fn)
}

func (l *lazyStore) Delete(ctx context.Context, name string) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Delete(ctx, name)
}

// cond is the connected store's conditional writes (upload.Conditional).
func (l *lazyStore) cond(ctx context.Context) (upload.Conditional, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return upload.AsConditional(s)
}

func (l *lazyStore) GetVersion(ctx context.Context, name string, max int64) ([]byte, string, error) {
	c, err := l.cond(ctx)
	if err != nil {
		return nil, "", err
	}
	return c.GetVersion(ctx, name, max)
}

func (l *lazyStore) PutIf(ctx context.Context, name string, data []byte, match string) (string, error) {
	c, err := l.cond(ctx)
	if err != nil {
		return "", err
	}
	return c.PutIf(ctx, name, data, match)
}
