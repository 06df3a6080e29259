package engine

import (
	"context"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/proc"
)

// Nothing of a process image is hashed, compressed or packed while the
// sandbox is frozen: every blob of the image reaches the store
// (PhaseImageBlob, counted by the AtPhase hook) with the container
// running, after the thaw, while the dump itself (PhaseDump) did see it
// frozen. A first turn with a dev server (busybox httpd) and a changed file,
// so the cut also covers a scan, and a second one whose only change is a
// new process.
func TestImageStoredOnlyAfterThaw(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	var mu sync.Mutex
	var e *Engine
	var rt *proc.Runtime
	id := ""
	seen := map[string]map[proc.Status]int{}
	e, err := Open(ctx, Options{Home: t.TempDir() + "/home", AtPhase: func(phase string) {
		mu.Lock()
		defer mu.Unlock()
		if rt == nil || (phase != PhaseDump && phase != PhaseImageBlob && phase != PhaseStore) {
			return
		}
		st, err := rt.Status(id)
		if err != nil {
			t.Errorf("status at %s: %v", phase, err)
		}
		if seen[phase] == nil {
			seen[phase] = map[proc.Status]int{}
		}
		seen[phase][st]++
	}})
	must(t, err)
	t.Cleanup(func() { e.RemoveSandbox(context.Background(), "w"); e.Close() })
	cr, err := e.CreateSandbox(ctx, "w", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	_, err = e.Processes().Exec(ctx, "w", []string{"httpd", "-f", "-p", "8080", "-h", "/www"}, ExecOptions{Detach: true})
	must(t, err)
	mu.Lock()
	rt, err = e.Processes().Runtime(ctx)
	id = e.Processes().ContainerID("w")
	mu.Unlock()
	must(t, err)
	for turn, file := range []bool{true, false} {
		if file {
			write(t, cr.Root+"/tmp/f", "changed\n")
		} else { // a new process: a process change whatever the loop did
			_, err = e.Processes().Exec(ctx, "w", []string{"sleep", "3600"}, ExecOptions{Detach: true})
			must(t, err)
		}
		mu.Lock()
		clear(seen)
		mu.Unlock()
		r, err := e.Checkpoint(ctx, "w", CheckpointOptions{})
		must(t, err)
		if r.Class != delta.ClassFull && r.Class != delta.ClassProcess {
			t.Fatalf("turn %d: class %s", turn, r.Class)
		}
		mu.Lock()
		dump, blobs := seen[PhaseDump], seen[PhaseImageBlob]
		mu.Unlock()
		if dump[proc.Paused] != 1 {
			t.Fatalf("turn %d: the dump saw the container %v, want paused once", turn, dump)
		}
		if blobs[proc.Running] == 0 || len(blobs) != 1 {
			t.Fatalf("turn %d: image blobs stored with the container %v: want all while running, none frozen", turn, blobs)
		}
		if r.ProcDump == nil || r.ProcDump.FrozenNs <= 0 || r.ProcDump.FrozenNs > r.Stats.PauseNs {
			t.Fatalf("turn %d: CRIU statistics %+v, pause %d ns", turn, r.ProcDump, r.Stats.PauseNs)
		}
	}
}
