package server_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/api"
)

// A branch's answer says where its fan-out spent its time (phases_ms):
// the phases run one after another and add up to at most the whole, the
// parts of prepare (base, layer) are at most prepare, every branch of one
// request carries the same split, and a rollback carries none.
func TestBranchPhasesOverTheAPI(t *testing.T) {
	f := serve(t, nil)
	ctx := context.Background()
	root := f.create(t, "src")
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("phases\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := f.c.Checkpoint(ctx, "src", api.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := f.c.Branch(ctx, string(cp.ID), api.BranchRequest{Name: "ph", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("%d branches, want 3", len(rs))
	}
	ph := rs[0].PhasesMS
	for _, name := range []string{"prepare", "base", "roots", "catalog", "files"} {
		if ph[name] <= 0 {
			t.Errorf("phase %s missing from %v", name, ph)
		}
	}
	if _, ok := ph["processes"]; ok {
		t.Errorf("a branch without processes reports a processes phase: %v", ph)
	}
	seq := ph["prepare"] + ph["roots"] + ph["catalog"] + ph["files"]
	if seq > rs[0].DurationMS+0.01 {
		t.Errorf("the phases add up to %.3f ms, more than the branch's %.3f ms: %v", seq, rs[0].DurationMS, ph)
	}
	if ph["base"]+ph["layer"]+ph["image"] > ph["prepare"]+0.01 {
		t.Errorf("prepare's parts exceed it: %v", ph)
	}
	for _, r := range rs[1:] {
		if !maps.Equal(r.PhasesMS, ph) {
			t.Errorf("branch %s's phases %v differ from %s's %v (one fan-out)", r.Sandbox, r.PhasesMS, rs[0].Sandbox, ph)
		}
	}
	rb, err := f.c.Rollback(ctx, "src", api.RollbackRequest{Checkpoint: string(cp.ID)})
	if err != nil {
		t.Fatal(err)
	}
	if rb.PhasesMS != nil {
		t.Errorf("a rollback reports branch phases: %v", rb.PhasesMS)
	}
}
