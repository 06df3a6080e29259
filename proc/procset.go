package proc

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat times; 100 on every
// Linux architecture turnsnap runs on.
const clockTick = 10 * time.Millisecond

// Process is one long-lived process of a container, with the activity
// counters the kernel keeps for it. Counters only grow while the process
// lives; comparing two snapshots of them tells whether it ran at all.
type Process struct {
	// PID is the pid inside the container's pid namespace; CRIU restores it,
	// so it names the process across a restore.
	PID int `json:"pid"`
	// PPID is the parent's pid inside the container; 0 when the parent is
	// outside (the init, or a command runc exec is still running).
	PPID int `json:"ppid"`
	// HostPID is the pid on the host (changes with every restore).
	HostPID int `json:"host_pid"`
	// Start is the start time in clock ticks after the host's boot; with
	// PID it tells a process from a later one that got the same pid.
	Start   uint64   `json:"start"`
	Comm    string   `json:"comm"`
	Cmdline []string `json:"cmdline"`
	// State is the kernel's one-letter state (S sleeping, R running, ...).
	State   string `json:"state"`
	Threads int    `json:"threads"`
	// CPU is user+system time, at clock-tick resolution.
	CPU time.Duration `json:"cpu"`
	// RunTime is the time on a CPU summed over threads, in nanoseconds
	// (schedstat): sees even a wakeup too short for CPU to count.
	RunTime time.Duration `json:"run_time"`
	// Slices is how many times a thread was scheduled in (schedstat).
	Slices uint64 `json:"slices"`
	// VoluntaryCtxt and InvoluntaryCtxt are context switches, summed over
	// threads.
	VoluntaryCtxt   uint64 `json:"voluntary_ctxt"`
	InvoluntaryCtxt uint64 `json:"involuntary_ctxt"`
	// I/O through read/write-like syscalls (files, pipes, sockets), and
	// bytes that reached or came from storage (/proc/PID/io).
	ReadChars     uint64 `json:"rchar"`
	WriteChars    uint64 `json:"wchar"`
	ReadSyscalls  uint64 `json:"syscr"`
	WriteSyscalls uint64 `json:"syscw"`
	ReadBytes     uint64 `json:"read_bytes"`
	WriteBytes    uint64 `json:"write_bytes"`
	MinorFaults   uint64 `json:"minflt"`
	MajorFaults   uint64 `json:"majflt"`
	// RSS is the resident set in bytes (what a dump will write, roughly).
	RSS int64 `json:"rss"`
	// Refs are the files, pipes and sockets the process references (see
	// refs.go); Changed compares them.
	Refs []Ref `json:"refs,omitempty"`
	// Outside marks a process that is not a descendant of the container's
	// init (its parent lives outside the container). CRIU leaves such a
	// process out of a dump, so Checkpoint refuses while one exists.
	Outside bool `json:"outside,omitempty"`
}

// String names the process for messages: pid and command line.
func (p Process) String() string {
	cmd := strings.Join(p.Cmdline, " ")
	if cmd == "" {
		cmd = "[" + p.Comm + "]"
	}
	if len(cmd) > 60 {
		cmd = cmd[:57] + "..."
	}
	return fmt.Sprintf("%d (%s)", p.PID, cmd)
}

// ProcSet is the set of long-lived processes of one container at one
// instant, sorted by PID. The keeper (the container's idle init and its
// sleep) is left out: it is turnsnap's, not the sandbox's.
type ProcSet struct {
	Container string    `json:"container"`
	Taken     time.Time `json:"taken"`
	Procs     []Process `json:"procs"`
	// Keeper are the keeper's references (its executable, cwd, stdio): the
	// keeper is in every image, so a replaced /bin/sh invalidates an image
	// as a replaced server binary does.
	Keeper []Ref `json:"keeper,omitempty"`
	// Agent are the agent's own processes (AgentEnv, agent.go): not
	// sandbox state, listed for ps and left out of dumps.
	Agent []Process `json:"agent,omitempty"`
	// Tmpfs digests the container's tmpfs mounts (/dev, /dev/shm).
	Tmpfs []TmpfsState `json:"tmpfs,omitempty"`
	// TmpfsPristine: the tmpfs mounts hold only what a new container's do.
	TmpfsPristine bool `json:"tmpfs_pristine,omitempty"`
}

// NeedsImage reports whether the container holds state that only a CRIU
// image keeps: a long-lived process, or files in its tmpfs mounts. A
// container with neither is recreated afresh on restore.
func (s ProcSet) NeedsImage() bool { return len(s.Procs) > 0 || !s.TmpfsPristine }

// Snapshot reads the processes alive in container id now (zombies are not
// alive). It reads /proc and the container's cgroup and spawns nothing: a
// few hundred microseconds for a small container (BenchmarkCheckpoint/
// snapshot). The container may be paused.
func (r *Runtime) Snapshot(ctx context.Context, id string) (ProcSet, error) {
	set := ProcSet{Container: id, Taken: time.Now()}
	if err := checkID(id); err != nil {
		return set, err
	}
	ci, err := r.info(id)
	if err != nil {
		return set, err
	}
	if !ci.alive() {
		return set, fmt.Errorf("container %s: not running: %w", id, errdefs.ErrPrecondition)
	}
	pids, err := ci.pids()
	if err != nil {
		return set, err
	}
	type entry struct {
		p    Process
		st   procStat
		host int
	}
	byHost := make(map[int]*entry, len(pids))
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return set, err
		}
		p, st, err := readProcess(pid)
		if err != nil {
			continue // exited between the cgroup read and now: not alive
		}
		byHost[pid] = &entry{p: p, st: st, host: pid}
	}
	var keeperRefs []Ref
	init := byHost[ci.InitPID]
	keeper := init != nil && slices.ContainsFunc(init.p.Cmdline, func(a string) bool {
		return strings.Contains(a, keeperMarker)
	})
	parent := func(h int) (int, bool) {
		x, ok := byHost[h]
		if !ok {
			return 0, false
		}
		return x.st.ppid, true
	}
	agentRoots := map[int]bool{}
	for _, e := range byHost {
		if par, ok := byHost[e.st.ppid]; ok && e.host != ci.InitPID {
			e.p.PPID = par.p.PID
		}
		e.p.Outside = !descendsFrom(e.host, ci.InitPID, parent)
		if keeper && (e.host == ci.InitPID || isKeeperSleep(e.st, init.st, ci.InitPID)) {
			keeperRefs = append(keeperRefs, readRefs(e.host)...)
			continue
		}
		if e.p.Outside {
			root := outsideRoot(e.host, parent)
			is, seen := agentRoots[root]
			if !seen {
				is = isAgentRoot(root)
				agentRoots[root] = is
			}
			if is {
				set.Agent = append(set.Agent, e.p)
				continue
			}
		}
		e.p.Refs = readRefs(e.host)
		set.Procs = append(set.Procs, e.p)
	}
	slices.SortFunc(set.Procs, func(a, b Process) int { return a.PID - b.PID })
	slices.SortFunc(set.Agent, func(a, b Process) int { return a.PID - b.PID })
	set.Keeper = dedupeRefs(keeperRefs)
	if set.Tmpfs, set.TmpfsPristine, err = readTmpfs(ci.InitPID); err != nil {
		return set, fmt.Errorf("container %s: %w", id, err)
	}
	return set, nil
}

// dedupeRefs keeps one reference per key, sorted, for a set gathered from
// several processes (the keeper and its sleep).
func dedupeRefs(refs []Ref) []Ref {
	slices.SortStableFunc(refs, func(a, b Ref) int { return strings.Compare(a.key(), b.key()) })
	return slices.CompactFunc(refs, func(a, b Ref) bool { return a.key() == b.key() })
}

// isKeeperSleep recognises the keeper's own `sleep 3600`: a child of the
// init in the init's session and process group. Processes the sandbox
// starts are in sessions of their own (runc exec makes one per command),
// also once the init adopts them. The name is not checked: just after the
// fork, before the exec, the child is still called sh.
func isKeeperSleep(st, init procStat, initPID int) bool {
	return st.ppid == initPID && st.session == init.session && st.pgrp == init.pgrp
}

// descendsFrom reports whether host pid reaches root through parent links.
func descendsFrom(pid, root int, parent func(int) (int, bool)) bool {
	for range 4096 { // deeper than any real tree; bounds a corrupt read
		if pid == root {
			return true
		}
		pp, ok := parent(pid)
		if !ok {
			return false
		}
		pid = pp
	}
	return false
}

// readProcess reads one process's identity and counters from /proc.
func readProcess(pid int) (Process, procStat, error) {
	base := fmt.Sprintf("/proc/%d/", pid)
	b, err := os.ReadFile(base + "stat")
	if err != nil {
		return Process{}, procStat{}, err
	}
	st, err := parseStat(b)
	if err != nil {
		return Process{}, st, err
	}
	if st.state == 'Z' || st.state == 'X' {
		return Process{}, st, fmt.Errorf("process %d is dead", pid)
	}
	status, err := os.ReadFile(base + "status")
	if err != nil {
		return Process{}, st, err
	}
	cl, _ := os.ReadFile(base + "cmdline")
	p := Process{
		PID: nsPID(status), HostPID: pid, Start: st.start, Comm: st.comm,
		Cmdline: cmdline(cl), State: string(st.state), Threads: st.threads,
		CPU:         time.Duration(st.utime+st.stime) * clockTick,
		MinorFaults: st.minflt, MajorFaults: st.majflt,
		RSS: st.rssPages * int64(os.Getpagesize()),
	}
	if io, err := os.ReadFile(base + "io"); err == nil {
		var rc, wc, sr, sw, rb, wb string
		parseKV(io, map[string]*string{"rchar": &rc, "wchar": &wc, "syscr": &sr, "syscw": &sw,
			"read_bytes": &rb, "write_bytes": &wb})
		p.ReadChars, p.WriteChars, p.ReadSyscalls, p.WriteSyscalls = atou(rc), atou(wc), atou(sr), atou(sw)
		p.ReadBytes, p.WriteBytes = atou(rb), atou(wb)
	}
	run, sl, vol, invol, err := threadActivity(pid)
	if err != nil {
		return Process{}, st, err
	}
	p.RunTime, p.Slices, p.VoluntaryCtxt, p.InvoluntaryCtxt = time.Duration(run), sl, vol, invol
	return p, st, nil
}

// Baseline settings: snapshots settleGap apart, at most settleTries times.
const (
	settleGap   = 20 * time.Millisecond
	settleTries = 10
)

// Baseline returns the set to compare the next turn against, once the
// processes have settled: taken right after a Checkpoint and Resume (or a
// Restore), a plain Snapshot would miss the activity the dump itself caused
// (CRIU's parasite runs in every process, and thawed processes restart the
// syscalls the dump interrupted), and the next turn would look changed
// though nothing ran. Baseline takes snapshots settleGap apart until two
// agree, for at most settleTries gaps (200 ms); a container that never
// settles is busy, and its last snapshot is returned.
func (r *Runtime) Baseline(ctx context.Context, id string) (ProcSet, error) {
	prev, err := r.Snapshot(ctx, id)
	if err != nil {
		return prev, err
	}
	for range settleTries {
		select {
		case <-ctx.Done():
			return prev, ctx.Err()
		case <-time.After(settleGap):
		}
		cur, err := r.Snapshot(ctx, id)
		if err != nil {
			return cur, err
		}
		if changed, _ := Changed(prev, cur); !changed {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

// SharedWritable returns the files (paths inside the container) that a
// process of the set maps shared and writable: its stores change them
// with no syscall, which change events cannot see, and without moving
// their mtime once a page is dirty.
func (s ProcSet) SharedWritable() []string {
	var out []string
	add := func(refs []Ref) {
		for _, r := range refs {
			if r.SharedWrite && !slices.Contains(out, r.Path) {
				out = append(out, r.Path)
			}
		}
	}
	for _, p := range s.Procs {
		add(p.Refs)
	}
	add(s.Keeper)
	return out
}
