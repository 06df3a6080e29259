package remote

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/proc"
)

// startTime reads field 22 of /proc/PID/stat, as a lock's pid_start.
func startTime(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	v, err := strconv.ParseUint(f[22-3], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The staleness rule, with real processes: on the holder's machine (same
// hostname, boot id and pid namespace) a lock whose process has ended is
// stale at once, whatever its clock says; a live holder's lock is not; a
// pid that now names a process started at another time counts as ended.
// Another machine, and a lock written before boot ids were recorded, go by
// the clock alone.
func TestJudgeLock(t *testing.T) {
	here := thisMachine()
	if here.bootID == "" || here.pidNS == "" {
		t.Fatalf("no boot id or pid namespace on this machine: %+v", here)
	}
	self := proc.Self()
	if self.Start == 0 {
		t.Fatal("no start time for this process")
	}

	// A process that has ended, its start time taken while it ran.
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	deadPID, deadStart := child.Process.Pid, startTime(t, child.Process.Pid)
	liveChild := proc.Holder{PID: deadPID, Start: deadStart}
	if liveChild.Gone() {
		t.Fatal("a running child counts as gone")
	}
	child.Process.Kill()
	child.Wait()

	now := time.Now()
	window := delta.DefaultLockStaleAfter
	fresh := now.Add(-time.Second)
	lock := func(pid int, start uint64, boot string, refreshed time.Time) delta.Lock {
		return delta.Lock{Kind: "gc", Host: here.host, PID: pid, PIDStart: start, BootID: boot, PIDNS: here.pidNS,
			Refreshed: refreshed, StaleAfterNs: int64(window)}
	}
	for _, c := range []struct {
		name        string
		lock        delta.Lock
		stale, gone bool
		mod         time.Time // the object's modification time; zero: Refreshed
	}{
		{name: "same host, holder ended", lock: lock(deadPID, deadStart, here.bootID, fresh), stale: true, gone: true},
		{name: "same host, holder ended, start unknown", lock: lock(deadPID, 0, here.bootID, fresh), stale: true, gone: true},
		{name: "same host, holder alive", lock: lock(self.PID, self.Start, here.bootID, fresh)},
		{name: "same host, holder alive, start unknown", lock: lock(self.PID, 0, here.bootID, fresh)},
		{name: "same host, pid recycled by another process", lock: lock(self.PID, self.Start+1, here.bootID, fresh), stale: true, gone: true},
		{name: "another boot, holder pid ended here", lock: lock(deadPID, deadStart, "another-boot", fresh)},
		{name: "older version, no boot id", lock: func() delta.Lock { l := lock(deadPID, 0, "", fresh); l.PIDNS = ""; return l }()},
		{name: "another hostname", lock: func() delta.Lock { l := lock(deadPID, deadStart, here.bootID, fresh); l.Host += "-other"; return l }()},
		{name: "another pid namespace", lock: func() delta.Lock { l := lock(deadPID, deadStart, here.bootID, fresh); l.PIDNS = "pid:[1]"; return l }()},
		{name: "another boot, window passed", lock: lock(self.PID, self.Start, "another-boot", now.Add(-window-time.Second)), stale: true},
		{name: "same host, holder alive, window passed", lock: lock(self.PID, self.Start, here.bootID, now.Add(-window-time.Second)), stale: true},
		{name: "older version, no window, 9 minutes", lock: delta.Lock{Kind: "push", Host: here.host, PID: deadPID}, mod: now.Add(-9 * time.Minute)},
		{name: "older version, no window, 11 minutes", lock: delta.Lock{Kind: "push", Host: here.host, PID: deadPID}, mod: now.Add(-11 * time.Minute), stale: true},
	} {
		mod := c.mod
		if mod.IsZero() {
			mod = c.lock.Refreshed
		}
		stale, gone := judge(&c.lock, mod, now, here)
		if stale != c.stale || gone != c.gone {
			t.Errorf("%s: stale %v gone %v, want %v %v", c.name, stale, gone, c.stale, c.gone)
		}
	}
	if delta.DefaultLockStaleAfter > time.Minute {
		t.Errorf("default stale window %s: a killed holder would block other hosts longer than a minute", delta.DefaultLockStaleAfter)
	}
}
