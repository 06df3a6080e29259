package sched_test

// Cancellation, Close, statistics, retries and the bandwidth cap.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/sched"
)

func TestCancelQueued(t *testing.T) {
	rec := newRecorder(t, func(n string) bool { return n == "first" })
	s := newSched(t, sched.Config{Store: rec, Concurrency: 1, UrgentSlots: -1})
	first := submit(t, s, upl("a", "first", []byte("1")))
	waitFor(t, "the first upload to start", func() bool { return len(rec.order()) == 1 })
	ctx, cancel := context.WithCancel(t.Context())
	tk, err := s.Submit(ctx, upl("b", "second", make([]byte, 1000)))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := tk.Wait(t.Context()); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled upload: %v, want context.Canceled", err)
	}
	if st := s.Stats(); st.Queued != 0 || st.Sandboxes["b"].Uploads != 0 {
		t.Errorf("after cancelling, Stats = %+v; want nothing queued", st)
	}
	rec.open()
	if err := first.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rec.order(), "second") {
		t.Error("the cancelled upload ran")
	}
}

func TestStats(t *testing.T) {
	rec := newRecorder(t, func(n string) bool { return n == "a/0" })
	s := newSched(t, sched.Config{Store: rec, Concurrency: 1, UrgentSlots: -1})
	var all []*sched.Ticket
	for i := range 3 {
		all = append(all, submit(t, s, upl("A", fmt.Sprintf("a/%d", i), make([]byte, 1<<20))))
	}
	waitFor(t, "the first upload to start", func() bool { return len(rec.order()) == 1 })
	for i := range 2 {
		all = append(all, submit(t, s, upl("B", fmt.Sprintf("b/%d", i), make([]byte, 10<<10))))
	}
	st := s.Stats()
	if st.Running != 1 || st.Queued != 4 || st.PendingBytes != 3<<20+20<<10 ||
		st.Sandboxes["A"] != (sched.SandboxStats{Uploads: 3, PendingBytes: 3 << 20}) ||
		st.Sandboxes["B"] != (sched.SandboxStats{Uploads: 2, PendingBytes: 20 << 10}) {
		t.Errorf("Stats while the first upload is held = %+v", st)
	}
	rec.open()
	if err := sched.Wait(t.Context(), all...); err != nil {
		t.Fatal(err)
	}
	st = s.Stats()
	if st.Completed != 5 || st.Queued != 0 || st.Running != 0 || len(st.Sandboxes) != 0 || st.SentBytes != 3<<20+20<<10 {
		t.Errorf("Stats when all is done = %+v", st)
	}
}

func TestCloseDrains(t *testing.T) {
	rec := newRecorder(t, nil)
	s, err := sched.New(sched.Config{Store: rec, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	var all []*sched.Ticket
	for i := range 20 {
		all = append(all, submit(t, s, upl(fmt.Sprint(i%3), fmt.Sprintf("o/%d", i), make([]byte, 10<<10))))
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, tk := range all {
		if !isDone(tk) || tk.Err() != nil {
			t.Fatalf("after Close, %s: done %v, err %v", tk.Name, isDone(tk), tk.Err())
		}
	}
	if _, err := s.Submit(t.Context(), upl("x", "late", nil)); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("Submit after Close: %v, want ErrPrecondition", err)
	}
}

func TestCloseAborts(t *testing.T) {
	rec := newRecorder(t, func(string) bool { return true })
	s, err := sched.New(sched.Config{Store: rec, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	var all []*sched.Ticket
	for i := range 3 {
		all = append(all, submit(t, s, upl("a", fmt.Sprintf("o/%d", i), []byte("x"))))
	}
	r := upl("a", "rec", []byte("r"))
	r.After = all
	all = append(all, submit(t, s, r))
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := s.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close past its deadline: %v", err)
	}
	for _, tk := range all {
		if !isDone(tk) || !errors.Is(tk.Err(), context.Canceled) {
			t.Errorf("after an aborted Close, %s: done %v, err %v; want context.Canceled", tk.Name, isDone(tk), tk.Err())
		}
	}
}

// TestRetryRewinds: with WithRetry under the scheduler, a Put cut off
// halfway is sent again from the start of the (seekable) body.
func TestRetryRewinds(t *testing.T) {
	local, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := upload.NewFaulty(local, upload.FaultPlan{HalfPut: []int{1}})
	store := upload.WithRetry(f, upload.RetryPolicy{BaseDelay: time.Millisecond, BufferLimit: 1})
	s := newSched(t, sched.Config{Store: store, BytesPerSec: 64 << 20})
	data := bytes.Repeat([]byte("0123456789"), 100_000)
	if err := submit(t, s, upl("a", "obj", data)).Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	got, err := upload.ReadAll(t.Context(), local, "obj")
	if err != nil || !bytes.Equal(got, data) || f.Calls(upload.OpPut) != 2 {
		t.Errorf("after a retried upload: %d bytes, %v, %d Puts; want the data after 2", len(got), err, f.Calls(upload.OpPut))
	}
	if st := s.Stats(); st.SentBytes != int64(len(data))*3/2 {
		t.Errorf("SentBytes = %d, want %d (half, then all again)", st.SentBytes, len(data)*3/2)
	}
}

// TestBandwidthCap sends 12 MiB through a local store capped at 8 MiB/s.
func TestBandwidthCap(t *testing.T) {
	const capBps = 8 << 20
	rec := newRecorder(t, nil)
	s := newSched(t, sched.Config{Store: rec, BytesPerSec: capBps})
	var all []*sched.Ticket
	start := time.Now()
	for i := range 12 {
		all = append(all, submit(t, s, upl(fmt.Sprint(i%2), fmt.Sprintf("o/%d", i), make([]byte, 1<<20))))
	}
	if err := sched.Wait(t.Context(), all...); err != nil {
		t.Fatal(err)
	}
	rate := float64(12<<20) / time.Since(start).Seconds()
	t.Logf("12 MiB in %s: %.2f MiB/s against a cap of %d MiB/s", time.Since(start).Round(time.Millisecond), rate/(1<<20), capBps>>20)
	if rate > capBps*1.1 || rate < capBps*0.9 {
		t.Errorf("rate %.0f B/s is not within 10%% of the cap %d B/s", rate, capBps)
	}
}

// TestFromStore copies an object from one store to another through the
// scheduler, the way the engine moves a committed pack off the host.
func TestFromStore(t *testing.T) {
	local, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("pack"), 50_000)
	if err := upload.PutBytes(t.Context(), local, "packs/p", data); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, nil)
	s := newSched(t, sched.Config{Store: rec})
	u := sched.Upload{Sandbox: "a", Name: "packs/p", Size: int64(len(data)), Open: sched.FromStore(t.Context(), local, "packs/p")}
	if err := submit(t, s, u).Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, err := upload.ReadAll(t.Context(), rec, "packs/p"); err != nil || !bytes.Equal(got, data) {
		t.Errorf("copied object: %d bytes, %v", len(got), err)
	}
}
