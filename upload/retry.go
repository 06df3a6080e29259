package upload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// RetryPolicy bounds what WithRetry does. The zero value means the defaults
// given with each field.
type RetryPolicy struct {
	// MaxAttempts is the number of tries per call, the first included;
	// 0 means 8. With the default delays that waits about 20 s in all,
	// enough to ride out a server restart or a short network outage
	// without holding a checkpoint's upload for minutes.
	MaxAttempts int
	// BaseDelay is the wait after the first failure; it doubles after each
	// further one, up to MaxDelay. 0 means 200 ms and 10 s.
	BaseDelay, MaxDelay time.Duration
	// MaxElapsed bounds the whole call: no new attempt starts when the
	// next wait would end later than MaxElapsed after the call began.
	// 0 means 2 minutes.
	MaxElapsed time.Duration
	// BufferLimit is the largest Put body that WithRetry copies into memory
	// so it can send it again, when the reader cannot seek back itself
	// (an io.Seeker such as *os.File or *bytes.Reader is rewound instead).
	// A larger body that cannot seek gets a single attempt. 0 means 32 MiB,
	// the S3 store's part size, so every pack can be retried.
	BufferLimit int64
	// OnRetry, if set, is called before each wait, for logs and metrics.
	OnRetry func(op Op, what string, attempt int, err error)
	// Logger gets one debug line per retry; nil means slog.Default().
	Logger *slog.Logger
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 8
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = 200 * time.Millisecond
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 10 * time.Second
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = 2 * time.Minute
	}
	if p.BufferLimit <= 0 {
		p.BufferLimit = DefaultPartSize
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	return p
}

// backoff is the wait before attempt n+1 after n failures: exponential,
// capped, with "equal jitter" (half fixed, half random) so that many
// uploads failing together do not all come back at the same instant.
func (p RetryPolicy) backoff(failures int) time.Duration {
	d := p.MaxDelay
	if failures < 40 { // beyond that the shift overflows; the cap applies anyway
		d = min(p.BaseDelay<<(failures-1), p.MaxDelay)
	}
	return d/2 + rand.N(d/2+1)
}

// Retryable reports whether err may go away if the same call is made again:
// errdefs.ErrUnavailable (which the S3 store uses for 5xx answers, throttling
// and connections that failed), timeouts, refused or reset connections and
// truncated bodies. ErrNotFound, ErrInvalid, ErrCorrupt, ErrPrecondition,
// ErrExists and context errors never are, whatever else they wrap.
func Retryable(err error) bool {
	for _, final := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrCorrupt,
		errdefs.ErrPrecondition, errdefs.ErrExists, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, final) {
			return false
		}
	}
	if errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.ECONNABORTED, syscall.EPIPE, syscall.ETIMEDOUT} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Resumer is implemented by object bodies (what Get and GetRange return)
// that can carry on after a Read failed: Resume closes the body and returns
// a new one that starts at the first byte not yet returned, from the same
// version of the object, failing with errdefs.ErrPrecondition if the object
// has been replaced since. WithRetry uses it to retry a read that broke
// midway without starting over and without splicing two versions together.
type Resumer interface {
	Resume(ctx context.Context) (io.ReadCloser, error)
}

// retryStore is the Store WithRetry returns.
type retryStore struct {
	inner Store
	p     RetryPolicy
}

// WithRetry returns s wrapped so that every call which fails with a
// Retryable error is tried again, after an exponential backoff with
// jitter, within the policy's bounds on attempts and total time; the
// context is honoured throughout, also while waiting. The result keeps the
// RangeGetter fast path.
//
// What is retried:
//   - Put sends the whole body again: an io.Seeker is rewound to where it
//     stood when Put was called; any other reader is first copied into
//     memory if it is at most BufferLimit bytes, and otherwise gets one
//     attempt only.
//   - Get and GetRange retry opening the object, and, when the body is a
//     Resumer, a read that breaks midway resumes where it stopped.
//   - List retries the listing and skips the names fn has already seen, so
//     fn sees each object once, in order. An error from fn is never retried.
//   - Stat and Delete (idempotent) are simply called again.
func WithRetry(s Store, p RetryPolicy) Store {
	return &retryStore{inner: s, p: p.withDefaults()}
}

// do calls fn until it succeeds, fails for good, or the policy or ctx ends
// the retries. what names the object or listing, for errors and logs.
func (r *retryStore) do(ctx context.Context, op Op, what string, fn func() error) error {
	return r.p.do(ctx, op, what, fn)
}

func (p RetryPolicy) do(ctx context.Context, op Op, what string, fn func() error) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := fn()
		if p, ok := err.(permanent); ok {
			return p.err
		}
		if err == nil || !Retryable(err) || ctx.Err() != nil {
			return err
		}
		if attempt >= p.MaxAttempts {
			return fmt.Errorf("%s: giving up after %d attempts: %w", op, attempt, err)
		}
		wait := p.backoff(attempt)
		if time.Since(start)+wait > p.MaxElapsed {
			return fmt.Errorf("%s: giving up after %d attempts in %s: %w", op, attempt, time.Since(start).Round(time.Millisecond), err)
		}
		if p.OnRetry != nil {
			p.OnRetry(op, what, attempt, err)
		}
		p.Logger.Debug("store call failed, retrying", "op", op, "what", what, "attempt", attempt, "wait", wait, "err", err)
		if serr := sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%s: %w (while waiting to retry after: %v)", what, serr, err)
		}
	}
}

// permanent carries an error that do must return as it is, without
// retrying, whatever its class: the caller's own, such as List's fn's.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }

// sleep waits for d or until ctx is done, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *retryStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := r.do(ctx, OpGet, "object "+name, func() (err error) {
		rc, err = r.inner.Get(ctx, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r.body(ctx, name, rc), nil
}

func (r *retryStore) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := r.do(ctx, OpGet, "object "+name, func() (err error) {
		rc, err = GetRange(ctx, r.inner, name, offset, length)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r.body(ctx, name, rc), nil
}

func (r *retryStore) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	var info ObjectInfo
	err := r.do(ctx, OpStat, "object "+name, func() (err error) {
		info, err = r.inner.Stat(ctx, name)
		return err
	})
	return info, err
}

func (r *retryStore) Delete(ctx context.Context, name string) error {
	return r.do(ctx, OpDelete, "object "+name, func() error { return r.inner.Delete(ctx, name) })
}

func (r *retryStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	var (
		last  string // the last name fn saw; names come in lexical order
		seen  bool
		fnErr error // fn's own error, never retried
	)
	return r.do(ctx, OpList, fmt.Sprintf("list %q", prefix), func() error {
		err := r.inner.List(ctx, prefix, func(info ObjectInfo) error {
			if seen && info.Name <= last {
				return nil // delivered before the listing broke
			}
			last, seen = info.Name, true
			fnErr = fn(info)
			return fnErr
		})
		if fnErr != nil {
			return permanent{fnErr}
		}
		return err
	})
}
