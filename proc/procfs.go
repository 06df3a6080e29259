package proc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// containerInfo is what Snapshot and the exec checks need from runc's own
// state file (<root>/<id>/state.json, runc 1.1's layout). Reading it costs a
// file read where `runc state` + `runc ps` would cost two process spawns,
// which matters on the skip path of every turn.
type containerInfo struct {
	ID        string            `json:"id"`
	InitPID   int               `json:"init_process_pid"`
	InitStart uint64            `json:"init_process_start"`
	Cgroups   map[string]string `json:"cgroup_paths"`
	Config    struct {
		Rootfs string `json:"rootfs"`
	} `json:"config"`
}

func (r *Runtime) info(id string) (containerInfo, error) {
	var ci containerInfo
	b, err := os.ReadFile(filepath.Join(runcRoot(r.cfg.StateRoot), id, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return ci, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return ci, fmt.Errorf("container %s: state: %w", id, err)
	}
	if err := json.Unmarshal(b, &ci); err != nil || ci.InitPID <= 0 {
		return ci, fmt.Errorf("container %s: runc state file not understood (runc newer than 1.1?): %v: %w", id, err, errdefs.ErrCorrupt)
	}
	return ci, nil
}

// alive reports whether the container's init still runs (same pid, same
// start time: not a recycled pid).
func (ci containerInfo) alive() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ci.InitPID))
	if err != nil {
		return false
	}
	st, err := parseStat(b)
	return err == nil && st.start == ci.InitStart && st.state != 'Z' && st.state != 'X'
}

// frozen reports whether the container's freezer cgroup is frozen (Pause).
func (ci containerInfo) frozen() bool {
	b, err := os.ReadFile(filepath.Join(ci.Cgroups["freezer"], "freezer.state"))
	return err == nil && strings.TrimSpace(string(b)) != "THAWED"
}

// pids lists the host pids (thread-group ids) in the container's cgroup.
// The freezer hierarchy is the one Pause acts on, so it is read first.
func (ci containerInfo) pids() ([]int, error) {
	for _, ctl := range []string{"freezer", "pids", "memory", ""} {
		dir, ok := ci.Cgroups[ctl]
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		var pids []int
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				pids = append(pids, p)
			}
		}
		return pids, nil
	}
	return nil, fmt.Errorf("container %s: no readable cgroup among %v: %w", ci.ID, ci.Cgroups, errdefs.ErrUnavailable)
}

// procStat is the part of /proc/PID/stat Snapshot uses.
type procStat struct {
	comm                string
	state               byte
	ppid, pgrp, session int
	minflt, majflt      uint64
	utime, stime        uint64 // clock ticks
	threads             int
	start               uint64 // clock ticks after boot
	rssPages            int64
}

// parseStat parses /proc/PID/stat. The command name may hold spaces and
// parentheses, so fields are counted from its last ')'.
func parseStat(b []byte) (procStat, error) {
	var st procStat
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return st, fmt.Errorf("stat %q: %w", b, errdefs.ErrCorrupt)
	}
	st.comm = string(b[open+1 : end])
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 22 { // through field 24 (rss); f[0] is field 3
		return st, fmt.Errorf("stat: %d fields: %w", len(f)+2, errdefs.ErrCorrupt)
	}
	field := func(n int) uint64 { v, _ := strconv.ParseUint(f[n-3], 10, 64); return v }
	st.state = f[0][0]
	st.ppid, st.pgrp, st.session = int(field(4)), int(field(5)), int(field(6))
	st.minflt, st.majflt = field(10), field(12)
	st.utime, st.stime = field(14), field(15)
	st.threads = int(field(20))
	st.start = field(22)
	rss, _ := strconv.ParseInt(f[24-3], 10, 64)
	st.rssPages = rss
	return st, nil
}

// parseKV parses "Key: value" (status) or "key: value" (io) files into the
// fields asked for.
func parseKV(b []byte, want map[string]*string) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if p, hit := want[k]; ok && hit {
			*p = strings.TrimSpace(v)
		}
	}
}

func atou(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }

// threadActivity sums, over every thread of pid, the scheduler's view:
// nanoseconds on a CPU and number of times scheduled in (schedstat), and
// voluntary / involuntary context switches (status). Per thread because
// /proc/PID/status counts the main thread only.
func threadActivity(pid int) (runNS, slices, vol, invol uint64, err error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tids, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	for _, t := range tids {
		if b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat")); err == nil {
			if f := strings.Fields(string(b)); len(f) >= 3 {
				runNS += atou(f[0])
				slices += atou(f[2])
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, t.Name(), "status")); err == nil {
			var v, iv string
			parseKV(b, map[string]*string{"voluntary_ctxt_switches": &v, "nonvoluntary_ctxt_switches": &iv})
			vol += atou(v)
			invol += atou(iv)
		}
	}
	return runNS, slices, vol, invol, nil
}

// nsPID is pid's number in its innermost pid namespace (the last NSpid).
func nsPID(status []byte) int {
	var s string
	parseKV(status, map[string]*string{"NSpid": &s})
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[len(f)-1])
	return n
}

// cmdline splits /proc/PID/cmdline into its arguments.
func cmdline(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}
