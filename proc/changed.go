package proc

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Changed tells whether the long-lived processes of cur differ from those
// of prev (the set taken at the last checkpoint, by Baseline), and why.
//
// Not a change: commands that ran and exited in between (they are in
// neither set), and processes that existed in both and did not run at all,
// while nothing they reference changed.
// A change: a process appeared, exited, was replaced by a later one with the
// same pid, exec'd another program, or ran: any CPU time, scheduling,
// context switch, read or write, page fault or thread count difference.
// Running is taken to mean its memory may differ, because without
// soft-dirty tracking nothing cheaper can tell. Counters that went down
// cannot happen to one process, so they too count as a change: when unsure,
// changed. Also a change, although no process ran: a file a process holds
// open, maps, or uses as cwd, root or executable was replaced, deleted,
// resized, rewritten or chmod'ed (the image records it as it was); the
// bytes waiting in a pipe or socket a process holds differ; a tmpfs of the
// container (/dev/shm) differs; the keeper's references changed.
//
// The reason names up to three processes, e.g. `process 7 (httpd -f -p
// 8080) ran: 1.2ms on CPU, 3 context switches, 1.4 KiB written`.
func Changed(prev, cur ProcSet) (bool, string) {
	var reasons []string
	before := make(map[int]Process, len(prev.Procs))
	for _, p := range prev.Procs {
		before[p.PID] = p
	}
	seen := make(map[int]bool, len(cur.Procs))
	for _, c := range cur.Procs {
		seen[c.PID] = true
		p, ok := before[c.PID]
		switch {
		case !ok:
			reasons = append(reasons, fmt.Sprintf("process %s appeared", c))
		case p.Start != c.Start:
			reasons = append(reasons, fmt.Sprintf("process %s replaced %s", c, p))
		case !slices.Equal(p.Cmdline, c.Cmdline):
			reasons = append(reasons, fmt.Sprintf("process %s now runs %q", p, strings.Join(c.Cmdline, " ")))
		default:
			// References first: they name the file that makes a carried
			// image unusable, which is what a user needs to read.
			for _, why := range refChanges(p.Refs, c.Refs) {
				reasons = append(reasons, fmt.Sprintf("process %s %s", c, why))
			}
			if why := activity(p, c); why != "" {
				reasons = append(reasons, fmt.Sprintf("process %s %s", c, why))
			}
		}
	}
	for _, p := range prev.Procs {
		if !seen[p.PID] {
			reasons = append(reasons, fmt.Sprintf("process %s exited", p))
		}
	}
	for _, why := range refChanges(prev.Keeper, cur.Keeper) {
		reasons = append(reasons, "the container's init "+why)
	}
	reasons = append(reasons, tmpfsChanges(prev.Tmpfs, cur.Tmpfs)...)
	if len(reasons) == 0 {
		return false, ""
	}
	const show = 3
	msg := strings.Join(reasons[:min(show, len(reasons))], "; ")
	if len(reasons) > show {
		msg += fmt.Sprintf("; and %d more", len(reasons)-show)
	}
	return true, msg
}

// activity describes what one process did between two snapshots, or ""
// when it did nothing.
func activity(p, c Process) string {
	type counter struct {
		name     string
		was, now uint64
	}
	cs := []counter{
		{"ns on CPU", uint64(p.RunTime), uint64(c.RunTime)},
		{"CPU ticks", uint64(p.CPU / clockTick), uint64(c.CPU / clockTick)},
		{"times scheduled", p.Slices, c.Slices},
		{"voluntary context switches", p.VoluntaryCtxt, c.VoluntaryCtxt},
		{"involuntary context switches", p.InvoluntaryCtxt, c.InvoluntaryCtxt},
		{"bytes read", p.ReadChars, c.ReadChars},
		{"bytes written", p.WriteChars, c.WriteChars},
		{"read calls", p.ReadSyscalls, c.ReadSyscalls},
		{"write calls", p.WriteSyscalls, c.WriteSyscalls},
		{"storage bytes read", p.ReadBytes, c.ReadBytes},
		{"storage bytes written", p.WriteBytes, c.WriteBytes},
		{"minor faults", p.MinorFaults, c.MinorFaults},
		{"major faults", p.MajorFaults, c.MajorFaults},
	}
	var did []string
	for _, x := range cs {
		switch {
		case x.now < x.was:
			return fmt.Sprintf("has fewer %s than before (%d < %d): not the same process?", x.name, x.now, x.was)
		case x.now > x.was && x.name == "ns on CPU":
			did = append(did, fmt.Sprintf("%v on CPU", time.Duration(x.now-x.was)))
		case x.now > x.was:
			did = append(did, fmt.Sprintf("%d %s", x.now-x.was, x.name))
		}
	}
	if p.Threads != c.Threads {
		did = append(did, fmt.Sprintf("%d threads where it had %d", c.Threads, p.Threads))
	}
	if len(did) == 0 {
		return ""
	}
	if len(did) > 4 {
		did = did[:4]
	}
	return "ran: " + strings.Join(did, ", ")
}
