package upload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (r *retryStore) Put(ctx context.Context, name string, body io.Reader, size int64) error {
	rewind, err := r.rewinder(name, body, size)
	if err != nil {
		return err
	}
	if rewind == nil {
		r.p.Logger.Debug("put body cannot be sent twice, no retries", "object", name, "size", size, "buffer_limit", r.p.BufferLimit)
		return r.inner.Put(ctx, name, body, size)
	}
	return r.do(ctx, OpPut, "object "+name, func() error {
		rd, err := rewind()
		if err != nil {
			return err
		}
		return r.inner.Put(ctx, name, rd, size)
	})
}

// rewinder returns a function giving, on each call, a reader positioned at
// the start of body: body itself, sought back if it is an io.Seeker, or a
// copy in memory if it is small enough. For a body that is neither it
// returns nil: that Put gets one attempt.
func (r *retryStore) rewinder(name string, body io.Reader, size int64) (func() (io.Reader, error), error) {
	if sk, ok := body.(io.Seeker); ok && size >= 0 {
		if start, err := sk.Seek(0, io.SeekCurrent); err == nil {
			first := true
			return func() (io.Reader, error) {
				if !first {
					if _, err := sk.Seek(start, io.SeekStart); err != nil {
						return nil, fmt.Errorf("object %s: rewinding the body: %w", name, err)
					}
				}
				first = false
				return body, nil
			}, nil
		}
	}
	if size < 0 || size > r.p.BufferLimit {
		return nil, nil
	}
	buf := make([]byte, size+1)
	n, err := io.ReadFull(body, buf)
	switch {
	case int64(n) > size:
		return nil, fmt.Errorf("object %s: reader has more than the declared %d bytes: %w", name, size, errdefs.ErrInvalid)
	case int64(n) < size && (err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		return nil, fmt.Errorf("object %s: reader ended after %d of %d bytes: %w", name, n, size, errdefs.ErrInvalid)
	case int64(n) < size:
		return nil, fmt.Errorf("object %s: reading the body: %w", name, err)
	}
	return func() (io.Reader, error) { return bytes.NewReader(buf[:size]), nil }, nil
}

// body wraps rc so that a read that breaks midway resumes, if rc can.
func (r *retryStore) body(ctx context.Context, name string, rc io.ReadCloser) io.ReadCloser {
	if _, ok := rc.(Resumer); !ok {
		return rc
	}
	return &retryBody{r: r, ctx: ctx, name: name, rc: rc}
}

// retryBody reads through a Resumer body and resumes it after a Retryable
// read error, with the policy's backoff. Its bound is MaxAttempts failures
// in a row without a byte read in between.
type retryBody struct {
	r    *retryStore
	ctx  context.Context
	name string
	rc   io.ReadCloser

	broken   error // the read error that must be resumed from before the next Read
	failures int   // consecutive failures without progress
}

func (b *retryBody) Read(p []byte) (int, error) {
	for {
		if b.broken != nil {
			if err := b.resume(); err != nil {
				return 0, err
			}
		}
		n, err := b.rc.Read(p)
		if n > 0 {
			b.failures = 0
		}
		if err == nil || err == io.EOF || !Retryable(err) || b.ctx.Err() != nil {
			return n, err
		}
		b.broken = err
		if n > 0 {
			return n, nil
		}
	}
}

// resume replaces the broken body with one that carries on where it stopped.
func (b *retryBody) resume() error {
	for {
		b.failures++
		if b.failures >= b.r.p.MaxAttempts {
			return fmt.Errorf("object %s: giving up resuming the read after %d attempts: %w", b.name, b.failures, b.broken)
		}
		wait := b.r.p.backoff(b.failures)
		if b.r.p.OnRetry != nil {
			b.r.p.OnRetry(OpGet, "object "+b.name, b.failures, b.broken)
		}
		b.r.p.Logger.Debug("object read broke, resuming", "object", b.name, "attempt", b.failures, "wait", wait, "err", b.broken)
		if err := sleep(b.ctx, wait); err != nil {
			return fmt.Errorf("object %s: %w (while waiting to resume after: %v)", b.name, err, b.broken)
		}
		next, err := b.rc.(Resumer).Resume(b.ctx)
		if err == nil {
			b.rc, b.broken = next, nil
			return nil
		}
		if !Retryable(err) || b.ctx.Err() != nil {
			return err
		}
		b.broken = err
	}
}

func (b *retryBody) Close() error { return b.rc.Close() }
