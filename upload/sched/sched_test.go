package sched_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/sched"
)

// seekCloser is an upload body that keeps bytes.Reader's Seek, as an
// *os.File would, so WithRetry can rewind it.
type seekCloser struct{ *bytes.Reader }

func (seekCloser) Close() error { return nil }

func open(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return seekCloser{bytes.NewReader(b)}, nil }
}

// recorder wraps a real store: it records the order Puts start in, and
// holds the Puts whose names hold says until release is closed, so a test
// can fill the queue while the workers are busy.
type recorder struct {
	upload.Store
	hold    func(name string) bool
	release chan struct{}

	mu     sync.Mutex
	starts []string
}

func newRecorder(t *testing.T, hold func(string) bool) *recorder {
	s, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if hold == nil {
		hold = func(string) bool { return false }
	}
	r := &recorder{Store: s, hold: hold, release: make(chan struct{})}
	t.Cleanup(r.open)
	return r
}

func (r *recorder) open() {
	select {
	case <-r.release:
	default:
		close(r.release)
	}
}

func (r *recorder) Put(ctx context.Context, name string, body io.Reader, size int64) error {
	r.mu.Lock()
	r.starts = append(r.starts, name)
	r.mu.Unlock()
	if r.hold(name) {
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return r.Store.Put(ctx, name, body, size)
}

func (r *recorder) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts)
}

func newSched(t *testing.T, cfg sched.Config) *sched.Scheduler {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler) // failures are asserted, not logged
	}
	s, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func submit(t *testing.T, s *sched.Scheduler, u sched.Upload) *sched.Ticket {
	t.Helper()
	tk, err := s.Submit(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func upl(sandbox, name string, data []byte) sched.Upload {
	return sched.Upload{Sandbox: sandbox, Name: name, Size: int64(len(data)), Open: open(data)}
}

// TestFairShares queues ten 1 MiB objects of one sandbox, then one small
// object each of five others, behind one worker: the small ones go next,
// not after the whole heavy queue.
func TestFairShares(t *testing.T) {
	rec := newRecorder(t, func(n string) bool { return n == "heavy/0" })
	s := newSched(t, sched.Config{Store: rec, Concurrency: 1, UrgentSlots: -1})
	mib := make([]byte, 1<<20)
	var all []*sched.Ticket
	for i := range 10 {
		all = append(all, submit(t, s, upl("heavy", fmt.Sprintf("heavy/%d", i), mib)))
	}
	waitFor(t, "the first upload to start", func() bool { return len(rec.order()) == 1 })
	for i := range 5 {
		all = append(all, submit(t, s, upl(fmt.Sprintf("light%d", i), fmt.Sprintf("light/%d", i), []byte("small"))))
	}
	rec.open()
	if err := sched.Wait(t.Context(), all...); err != nil {
		t.Fatal(err)
	}
	want := []string{"heavy/0", "light/0", "light/1", "light/2", "light/3", "light/4", "heavy/1"}
	if got := rec.order()[:7]; !slices.Equal(got, want) {
		t.Errorf("upload order starts %v, want %v", got, want)
	}
}

// TestUrgentLane: an urgent upload goes before the queued normal ones, and
// with an urgent slot it starts even while every normal worker is busy.
func TestUrgentLane(t *testing.T) {
	rec := newRecorder(t, func(n string) bool { return n == "bulk/0" })
	s := newSched(t, sched.Config{Store: rec, Concurrency: 1, UrgentSlots: -1})
	var all []*sched.Ticket
	for i := range 4 {
		all = append(all, submit(t, s, upl("bulk", fmt.Sprintf("bulk/%d", i), []byte("x"))))
	}
	waitFor(t, "the first upload to start", func() bool { return len(rec.order()) == 1 })
	u := upl("other", "wanted", []byte("y"))
	u.Urgent = true
	all = append(all, submit(t, s, u))
	rec.open()
	if err := sched.Wait(t.Context(), all...); err != nil {
		t.Fatal(err)
	}
	if got := rec.order()[1]; got != "wanted" {
		t.Errorf("after the running upload came %s, want the urgent one; order %v", got, rec.order())
	}

	// With an urgent slot, the urgent upload does not wait for the held one.
	rec = newRecorder(t, func(n string) bool { return n == "bulk/0" })
	s = newSched(t, sched.Config{Store: rec, Concurrency: 1})
	held := submit(t, s, upl("bulk", "bulk/0", []byte("x")))
	waitFor(t, "the first upload to start", func() bool { return len(rec.order()) == 1 })
	u.Urgent = true
	if err := submit(t, s, u).Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if held.Err() != nil || isDone(held) {
		t.Error("the held upload finished before the urgent one")
	}
	rec.open()
}

func isDone(t *sched.Ticket) bool {
	select {
	case <-t.Done():
		return true
	default:
		return false
	}
}

// TestPromote moves a sandbox's queued uploads ahead of everything else.
func TestPromote(t *testing.T) {
	rec := newRecorder(t, func(n string) bool { return n == "b/0" })
	s := newSched(t, sched.Config{Store: rec, Concurrency: 1, UrgentSlots: -1})
	big := make([]byte, 2<<20)
	var all []*sched.Ticket
	for i := range 4 {
		all = append(all, submit(t, s, upl("B", fmt.Sprintf("b/%d", i), big)))
	}
	waitFor(t, "the first upload to start", func() bool { return len(rec.order()) == 1 })
	for i := range 3 {
		all = append(all, submit(t, s, upl("A", fmt.Sprintf("a/%d", i), big)))
	}
	if n := s.Promote("A"); n != 3 {
		t.Errorf("Promote moved %d uploads, want 3", n)
	}
	if st := s.Stats(); st.Urgent != 3 {
		t.Errorf("Stats().Urgent = %d after Promote, want 3", st.Urgent)
	}
	rec.open()
	if err := sched.Wait(t.Context(), all...); err != nil {
		t.Fatal(err)
	}
	want := []string{"b/0", "a/0", "a/1", "a/2", "b/1"}
	if got := rec.order()[:5]; !slices.Equal(got, want) {
		t.Errorf("order starts %v, want %v", got, want)
	}
}

// TestAfter: a record goes up only after its packs, and not at all if one
// of them failed.
func TestAfter(t *testing.T) {
	rec := newRecorder(t, nil)
	s := newSched(t, sched.Config{Store: rec, Concurrency: 3})
	var packs []*sched.Ticket
	for i := range 3 {
		packs = append(packs, submit(t, s, upl("sb", fmt.Sprintf("packs/%d", i), make([]byte, 100<<10))))
	}
	r := upl("sb", "records/1", []byte("record"))
	r.After = packs
	if err := submit(t, s, r).Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := rec.order(); got[len(got)-1] != "records/1" {
		t.Errorf("order %v: the record did not go last", got)
	}

	broken := sched.Upload{Sandbox: "sb", Name: "packs/broken", Size: 1, Open: func() (io.ReadCloser, error) {
		return nil, fmt.Errorf("pack file gone: %w", errdefs.ErrNotFound)
	}}
	r = upl("sb", "records/2", []byte("record"))
	r.After = []*sched.Ticket{submit(t, s, broken)}
	err := submit(t, s, r).Wait(t.Context())
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "depends on packs/broken") {
		t.Errorf("record after a failed pack: %v, want the pack's error", err)
	}
	if slices.Contains(rec.order(), "records/2") {
		t.Error("the record was uploaded although its pack failed")
	}
}
