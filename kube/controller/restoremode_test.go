package controller

import (
	"errors"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
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
