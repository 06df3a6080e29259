package procs

import (
	"context"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// ProcessesOptions configures List. It has no fields yet; it is a
// struct so the daemon's route and later filters need no new signature.
type ProcessesOptions struct{}

// ProcessInfo is one long-lived process of a sandbox.
type ProcessInfo struct {
	PID     int       `json:"pid"`  // inside the sandbox (CRIU keeps it across a restore)
	PPID    int       `json:"ppid"` // 0 when the parent is outside the sandbox's tree
	Command []string  `json:"command"`
	Comm    string    `json:"comm"`
	Started time.Time `json:"started"`
	State   string    `json:"state"` // the kernel's letter: S sleeping, R running...
	Threads int       `json:"threads"`
	// CPUMs is user+system CPU time in milliseconds; RSSBytes the resident set.
	CPUMs    float64 `json:"cpu_ms"`
	RSSBytes int64   `json:"rss_bytes"`
	// InCheckpoint is true when the head checkpoint's process image holds
	// this process (the same pid started at the same instant was there
	// when the image was taken), so a rollback to the head brings it back.
	InCheckpoint bool `json:"in_checkpoint"`
}

// ProcessList is what List reports.
type ProcessList struct {
	Sandbox string   `json:"sandbox"`
	Running bool     `json:"running"` // the sandbox's container runs
	Head    delta.ID `json:"head"`
	// HeadHasImage says the head checkpoint has a process image at all.
	HeadHasImage bool          `json:"head_has_image"`
	Processes    []ProcessInfo `json:"processes"`
	// Interrupted is what an interrupted operation left (ps reports it and
	// finishes nothing): a pending rollback, or processes a finished
	// rollback could not restore.
	Interrupted *Interrupted `json:"interrupted,omitempty"`
}

// List lists the sandbox's long-lived processes (the container's own
// keeper left out) and whether the head checkpoint holds each. It reads
// /proc and runc's state and spawns nothing.
func (m *Manager) List(ctx context.Context, name delta.SandboxName, _ ProcessesOptions) (*ProcessList, error) {
	st, done, err := m.d.Load(ctx, name, false) // reads only: finishes nobody's work
	if err != nil {
		return nil, err
	}
	defer done()
	out := &ProcessList{Sandbox: string(name), Head: st.Head.ID, HeadHasImage: st.Head.ProcTree != nil, Processes: []ProcessInfo{},
		Interrupted: st.Interrupted}
	c := m.Container(name)
	running, err := m.Running(ctx, c)
	if err != nil || !running {
		return out, err
	}
	out.Running = true
	rt, err := m.Runtime(ctx)
	if err != nil {
		return nil, err
	}
	cur, err := rt.Snapshot(ctx, c.ID)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	held := map[[2]uint64]bool{}
	if out.HeadHasImage {
		for _, p := range m.baseline(name).Procs {
			held[[2]uint64{uint64(p.PID), p.Start}] = true
		}
	}
	for _, p := range cur.Procs {
		out.Processes = append(out.Processes, ProcessInfo{
			PID: p.PID, PPID: p.PPID, Command: p.Cmdline, Comm: p.Comm, Started: p.StartedAt(), State: p.State,
			Threads: p.Threads, CPUMs: float64(p.CPU.Microseconds()) / 1000, RSSBytes: p.RSS,
			InCheckpoint: held[[2]uint64{uint64(p.PID), p.Start}],
		})
	}
	return out, nil
}
