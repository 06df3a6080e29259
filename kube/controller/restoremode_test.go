package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// lazyFor: Auto is lazy exactly when it can be (an overlay root, no
// processes); Lazy refuses, as invalid, what it cannot do; Full never is.
func TestLazyFor(t *testing.T) {
	fsOnly := &api.LogEntry{ID: "0123456789abcdef", Backend: "overlay"}
	procs := &api.LogEntry{ID: "0123456789abcdef", Backend: "overlay", Processes: true}
	onBtrfs := &api.LogEntry{ID: "0123456789abcdef", Backend: "btrfs"}
	for _, c := range []struct {
		mode    v1.RestoreMode
		backend string
		cp      *api.LogEntry
		lazy    bool
		invalid bool
	}{
		{"", "", fsOnly, true, false},
		{v1.RestoreAuto, "overlay", fsOnly, true, false},
		{v1.RestoreAuto, "overlay", procs, false, false},
		{v1.RestoreAuto, "", onBtrfs, false, false},
		{v1.RestoreAuto, "btrfs", fsOnly, false, false},
		{v1.RestoreAuto, "overlay", onBtrfs, true, false}, // an overlay branch of a btrfs checkpoint
		{v1.RestoreLazy, "overlay", fsOnly, true, false},
		{v1.RestoreLazy, "overlay", procs, false, true},
		{v1.RestoreLazy, "btrfs", fsOnly, false, true},
		{v1.RestoreFull, "overlay", fsOnly, false, false},
		{v1.RestoreFull, "overlay", procs, false, false},
	} {
		lazy, err := lazyFor(c.mode, c.backend, c.cp)
		if lazy != c.lazy || errors.Is(err, errdefs.ErrInvalid) != c.invalid || (err != nil) != c.invalid {
			t.Errorf("mode %q backend %q checkpoint %+v: lazy %v, err %v; want lazy %v, invalid %v", c.mode, c.backend, c.cp, lazy, err, c.lazy, c.invalid)
		}
	}
}

// observeFill: the Filled condition from the node's report, its progress
// in tenths (so that a restore is about ten status writes), a fetch
// failure named once as an event, a fast look again only while files
// arrive.
func TestObserveFill(t *testing.T) {
	now := time.Unix(1000, 0)
	ev := &countEvents{}
	r := &sandboxReconciler{&reconciler{opts: Options{Now: func() time.Time { return now }}, events: ev}}
	n := node{Name: "n1", Expires: now.Add(time.Hour)}
	sb := &v1.TurnsnapSandbox{}
	cond := func() metav1.Condition { return *meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionFilled) }
	if next := r.observeFill(sb, n, &api.LazyRestore{Pending: 67, Filled: 33}); next != fillPoll || cond().Reason != "Fetching" || cond().Message != "30% of 100 files fetched" {
		t.Fatalf("fetching: next %v, %+v", next, cond())
	}
	msg := cond().Message
	r.observeFill(sb, n, &api.LazyRestore{Pending: 62, Filled: 38})
	if cond().Message != msg {
		t.Fatalf("38 of 100 changed the message written: %q", cond().Message)
	}
	for range 2 {
		if next := r.observeFill(sb, n, &api.LazyRestore{Pending: 5, Filled: 95, Error: "chunk 1234 of /big: object missing"}); next == fillPoll || cond().Reason != "FetchFailed" || cond().Status != metav1.ConditionFalse {
			t.Fatalf("failed fill: next %v, %+v", next, cond())
		}
	}
	if got := ev.n; got != 1 {
		t.Fatalf("a fetch failure seen twice made %d events, want 1", got)
	}
	if next := r.observeFill(sb, n, &api.LazyRestore{Filled: 100, Whole: true}); next == fillPoll || cond().Status != metav1.ConditionTrue {
		t.Fatalf("whole: next %v, %+v", next, cond())
	}
	if next := r.observeFill(sb, n, nil); next == fillPoll || cond().Status != metav1.ConditionUnknown {
		t.Fatalf("no restore on the node: next %v, %+v", next, cond())
	}
}

// countEvents counts the events recorded.
type countEvents struct{ n int }

func (c *countEvents) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {
	c.n++
}

func (c *countEvents) AnnotatedEventf(o, rel runtime.Object, _ map[string]string, t, reason, action, note string, args ...any) {
	c.Eventf(o, rel, t, reason, action, note, args...)
}
