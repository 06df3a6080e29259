package upload_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

func TestRetryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) upload.Store {
		return upload.WithRetry(newLocal(t, t.TempDir()), fastRetry)
	})
}

func TestRetryable(t *testing.T) {
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w", errdefs.ErrUnavailable), true},
		{fmt.Errorf("x: %w", syscall.ECONNRESET), true},
		{fmt.Errorf("x: %w", syscall.ECONNREFUSED), true},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("x: %w", timeout), true},
		{fmt.Errorf("x: %w", errdefs.ErrNotFound), false},
		{fmt.Errorf("x: %w", errdefs.ErrInvalid), false},
		{fmt.Errorf("x: %w", errdefs.ErrCorrupt), false},
		{fmt.Errorf("x: %w", errdefs.ErrPrecondition), false},
		{context.Canceled, false},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		// A final class wins over a transient cause it wraps.
		{fmt.Errorf("x: %w: %w", errdefs.ErrCorrupt, syscall.ECONNRESET), false},
		{errors.New("something else"), false},
	} {
		if got := upload.Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestRetryPutRecovers(t *testing.T) {
	f := upload.NewFaulty(newLocal(t, t.TempDir()), upload.FaultPlan{
		Fail: map[upload.Op][]int{upload.OpPut: {1, 2}}, HalfPut: []int{3},
	})
	var retries []int
	p := fastRetry
	p.OnRetry = func(_ upload.Op, _ string, attempt int, _ error) { retries = append(retries, attempt) }
	s := upload.WithRetry(f, p)
	data := randomBytes(1, 1<<20+3)
	// A seekable body that does not start at offset 0: retries must rewind
	// it to where it stood, not to its beginning.
	body := bytes.NewReader(append([]byte("skipped"), data...))
	body.Seek(7, io.SeekStart)
	if err := s.Put(t.Context(), "obj", body, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	wantStored(t, f, "obj", data)
	if got := f.Calls(upload.OpPut); got != 4 {
		t.Errorf("%d Put calls, want 4", got)
	}
	if !slices.Equal(retries, []int{1, 2, 3}) {
		t.Errorf("OnRetry saw attempts %v, want [1 2 3]", retries)
	}
}

// plain hides a reader's Seek, so WithRetry has to buffer it.
type plain struct{ r io.Reader }

func (p plain) Read(b []byte) (int, error) { return p.r.Read(b) }

func TestRetryBuffersUnseekableBody(t *testing.T) {
	data := randomBytes(2, 100<<10)
	f := upload.NewFaulty(newLocal(t, t.TempDir()), upload.FaultPlan{HalfPut: []int{1}})
	s := upload.WithRetry(f, fastRetry)
	if err := s.Put(t.Context(), "obj", plain{bytes.NewReader(data)}, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	wantStored(t, f, "obj", data)

	// Over the buffer limit: one attempt, whose error comes back.
	p := fastRetry
	p.BufferLimit = 10 << 10
	f = upload.NewFaulty(newLocal(t, t.TempDir()), upload.FaultPlan{HalfPut: []int{1}})
	s = upload.WithRetry(f, p)
	err := s.Put(t.Context(), "obj", plain{bytes.NewReader(data)}, int64(len(data)))
	if !errors.Is(err, errdefs.ErrUnavailable) || f.Calls(upload.OpPut) != 1 {
		t.Errorf("Put of an unseekable body over the limit: error %v after %d calls, want the fault after 1", err, f.Calls(upload.OpPut))
	}
}

// failing is a Store whose every call fails with err, counting calls.
type failing struct {
	upload.Store
	err   error
	calls atomic.Int64
}

func (f *failing) Stat(context.Context, string) (upload.ObjectInfo, error) {
	f.calls.Add(1)
	return upload.ObjectInfo{}, f.err
}

func TestRetryNeverOnFinalErrors(t *testing.T) {
	for _, class := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrCorrupt, errdefs.ErrPrecondition} {
		f := &failing{err: fmt.Errorf("object x: %w", class)}
		_, err := upload.WithRetry(f, fastRetry).Stat(t.Context(), "x")
		if !errors.Is(err, class) || f.calls.Load() != 1 {
			t.Errorf("%v: error %v after %d calls, want it after 1", class, err, f.calls.Load())
		}
	}
}

func TestRetryBounds(t *testing.T) {
	f := &failing{err: fmt.Errorf("object x: %w", errdefs.ErrUnavailable)}
	p := fastRetry
	p.MaxAttempts = 4
	_, err := upload.WithRetry(f, p).Stat(t.Context(), "x")
	if !errors.Is(err, errdefs.ErrUnavailable) || f.calls.Load() != 4 {
		t.Errorf("error %v after %d calls, want ErrUnavailable after 4", err, f.calls.Load())
	}

	// Total time: 10 ms waits growing to 200 ms, within 500 ms.
	f = &failing{err: fmt.Errorf("object x: %w", errdefs.ErrUnavailable)}
	p = upload.RetryPolicy{MaxAttempts: 1000, BaseDelay: 10 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxElapsed: 500 * time.Millisecond}
	start := time.Now()
	_, err = upload.WithRetry(f, p).Stat(t.Context(), "x")
	if took := time.Since(start); !errors.Is(err, errdefs.ErrUnavailable) || took > time.Second || f.calls.Load() < 3 {
		t.Errorf("error %v after %d calls in %s, want ErrUnavailable within the 500 ms bound", err, f.calls.Load(), took)
	}

	// The context ends the wait at once.
	f = &failing{err: fmt.Errorf("object x: %w", errdefs.ErrUnavailable)}
	p = upload.RetryPolicy{BaseDelay: time.Hour, MaxDelay: time.Hour, MaxElapsed: 2 * time.Hour}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = upload.WithRetry(f, p).Stat(ctx, "x")
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
		t.Errorf("error %v after %s, want the context's deadline at once", err, took)
	}
}

// breakingList delivers the first half of a listing and then fails, the
// first time it is asked.
type breakingList struct {
	upload.Store
	calls int
}

func (b *breakingList) List(ctx context.Context, prefix string, fn func(upload.ObjectInfo) error) error {
	b.calls++
	n := 0
	err := b.Store.List(ctx, prefix, func(info upload.ObjectInfo) error {
		if n++; b.calls == 1 && n > 3 {
			return fmt.Errorf("listing broke: %w", errdefs.ErrUnavailable)
		}
		return fn(info)
	})
	return err
}

func TestRetryListDeliversOnce(t *testing.T) {
	local := newLocal(t, t.TempDir())
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("x/%d", i)
		want = append(want, name)
		if err := upload.PutBytes(t.Context(), local, name, nil); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err := upload.WithRetry(&breakingList{Store: local}, fastRetry).List(t.Context(), "x/", func(info upload.ObjectInfo) error {
		got = append(got, info.Name)
		return nil
	})
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("List = %v, %v; want %v once each", got, err, want)
	}

	// An error from fn is the caller's and is not retried.
	stop := fmt.Errorf("stop: %w", errdefs.ErrUnavailable)
	calls := 0
	err = upload.WithRetry(local, fastRetry).List(t.Context(), "x/", func(upload.ObjectInfo) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("List with a failing fn: %v after %d calls, want fn's error after 1", err, calls)
	}
}

func TestRetryKeepsRangeGetter(t *testing.T) {
	s := upload.WithRetry(newLocal(t, t.TempDir()), fastRetry)
	if _, ok := s.(upload.RangeGetter); !ok {
		t.Error("WithRetry hides the RangeGetter fast path")
	}
}
