package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// collect reads the event stream resumed after last, through a real
// daemon's socket, until stop (called after each event) says so; a stream
// that ends first, or 60 s without enough events, fails the test.
func collect(t *testing.T, d *daemonProc, last string, stop func([]api.Event) bool) []api.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got []api.Event
	done := errors.New("done")
	err := d.client(t).EventsAfter(ctx, "", last, func(ev api.Event) error {
		got = append(got, ev)
		if stop(got) {
			return done
		}
		return nil
	})
	if !errors.Is(err, done) {
		t.Fatalf("event stream after %q ended: %v; got %d events: %+v", last, err, len(got), got)
	}
	return got
}

// TestServeLifecycleEventsResume: every state change is an event on
// /v1/events (sandbox created and removed, turn, rollback with its receipt,
// branch, restore, forget, gc), and a client that comes back with
// Last-Event-ID gets every event after it, in order, without a gap; one
// whose id the ring no longer has gets an explicit gap event first.
func TestServeLifecycleEventsResume(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	// A ring of 16: the test can outrun it.
	d := startDaemon(t, home, nil, "--event-ring", "16")

	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	must(t, json.Unmarshal([]byte(out), &created))
	os.WriteFile(filepath.Join(created.Root, "b"), []byte("turn 1\n"), 0o644)
	var c1 struct{ ID string }
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	must(t, json.Unmarshal([]byte(out), &c1))
	os.WriteFile(filepath.Join(created.Root, "b"), []byte("turn 2\n"), 0o644)
	mustCLI(t, home, "checkpoint", "s")
	mustCLI(t, home, "rollback", "s", c1.ID)
	mustCLI(t, home, "branch", c1.ID, "b")
	os.Remove(filepath.Join(created.Root, "a"))
	mustCLI(t, home, "restore", "s", c1.ID, "/a")
	mustCLI(t, home, "forget", "s", "--keep-last", "1")
	mustCLI(t, home, "gc")
	mustCLI(t, home, "sandbox", "rm", "b")
	want := []string{api.EventCreated, api.EventStarted, api.EventCommitted, api.EventStarted, api.EventCommitted,
		api.EventRollback, api.EventBranch, api.EventRestore, api.EventForget, api.EventGC, api.EventRemoved}

	// An id from another run of the daemon: a gap, then all of this run's.
	all := collect(t, d, "0:0", func(evs []api.Event) bool { return len(evs) == len(want)+1 })
	if all[0].Type != api.EventGap || all[0].After != 0 || all[0].Before != 1 {
		t.Fatalf("first event %+v, want a gap before seq 1", all[0])
	}
	all = all[1:]
	for i, ev := range all {
		if ev.Type != want[i] || ev.Seq != uint64(i+1) || ev.ID == "" {
			t.Fatalf("event %d: %s seq %d id %q, want %s seq %d", i, ev.Type, ev.Seq, ev.ID, want[i], i+1)
		}
	}
	rb := all[5]
	if rb.Sandbox != "s" || rb.Checkpoint != c1.ID || rb.Receipt == nil || !rb.Receipt.OK || rb.Receipt.Files.Want.String() == "" {
		t.Fatalf("rollback event %+v", rb)
	}
	if br := all[6]; br.Sandbox != "b" || br.Receipt == nil || !br.Receipt.OK {
		t.Fatalf("branch event %+v", br)
	}
	if all[0].Sandbox != "s" || all[10].Sandbox != "b" || all[7].Paths != 1 {
		t.Fatalf("created %+v, removed %+v, restore %+v", all[0], all[10], all[7])
	}

	// Resume after the rollback: the branch comes next, nothing before it,
	// no gap; then a live event after the backlog.
	var live string
	got := collect(t, d, rb.ID, func(evs []api.Event) bool {
		if len(evs) == len(all)-6 && live == "" {
			// The backlog is in: a new event now arrives live.
			live = "sent"
			mustCLI(t, home, "sandbox", "rm", "s")
		}
		return len(evs) == len(all)-6+1
	})
	for i, ev := range got[:len(all)-6] {
		if ev.Seq != all[6+i].Seq || ev.Type != all[6+i].Type {
			t.Fatalf("resumed event %d: %s seq %d, want %s seq %d", i, ev.Type, ev.Seq, all[6+i].Type, all[6+i].Seq)
		}
	}
	if last := got[len(got)-1]; last.Type != api.EventRemoved || last.Sandbox != "s" || last.Seq != uint64(len(all)+1) {
		t.Fatalf("live event %+v", last)
	}

	// Past the ring (16 events): resuming from the first event gets a gap
	// naming what is gone, then the ring's oldest onwards.
	for range 10 {
		mustCLI(t, home, "gc")
	}
	newest := uint64(len(all) + 1 + 10)
	got = collect(t, d, all[0].ID, func(evs []api.Event) bool { return len(evs) == 1+16 })
	if g := got[0]; g.Type != api.EventGap || g.After != 1 || g.Before != newest-15 {
		t.Fatalf("gap %+v, want after 1 before %d", g, newest-15)
	}
	if got[1].Seq != newest-15 || got[16].Seq != newest {
		t.Fatalf("after the gap seq %d ... %d, want %d ... %d", got[1].Seq, got[16].Seq, newest-15, newest)
	}
}
