package proc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/proc/criu"
)

// The host probe is cached under the binaries' identity: a second Runtime
// takes it from the cache, and a changed binary makes it probe again.
func TestProbeCacheKeyedByBinaries(t *testing.T) {
	needParts(t)
	ctx := testCtx(t)
	runcPath, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	myRunc := filepath.Join(dir, "runc")
	b, err := os.ReadFile(runcPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(myRunc, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "probe.json")
	cfg := Config{StateRoot: testStateRoot(), Runc: myRunc, ProbeCache: cache}
	rt, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	real := rt.RuncVersion()
	// Mark the cached answer: a Runtime that reads it reports the mark.
	c, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	marked := strings.Replace(string(c), `"runc": "`+real+`"`, `"runc": "from-cache"`, 1)
	if marked == string(c) {
		t.Fatalf("cache does not hold runc's version %q: %s", real, c)
	}
	if err := os.WriteFile(cache, []byte(marked), 0o600); err != nil {
		t.Fatal(err)
	}
	if rt, err = New(ctx, cfg); err != nil || rt.RuncVersion() != "from-cache" {
		t.Fatalf("second Runtime: runc %q, %v; want the cached answer", rt.RuncVersion(), err)
	}
	if rt.Host().CRIUVersion == 0 || len(rt.Host().CPUFlags) == 0 {
		t.Fatalf("cached host facts lost: %+v", rt.Host())
	}
	// A rebuilt runc (same path, new mtime) is probed again.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(myRunc, later, later); err != nil {
		t.Fatal(err)
	}
	if rt, err = New(ctx, cfg); err != nil || rt.RuncVersion() != real {
		t.Fatalf("after the binary changed: runc %q, %v; want a fresh probe (%q)", rt.RuncVersion(), err, real)
	}
}

// queued counts the bytes waiting in a pipe and in a socket through a
// duplicate of another process's descriptor, without reading them.
func TestQueuedBytes(t *testing.T) {
	needParts(t)
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.Write(p[1], []byte("hello"))
	s, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s[0])
	defer unix.Close(s[1])
	unix.Write(s[0], []byte("sixteen bytes..."))
	if n := queued(pidfd, p[0]); n != 5 {
		t.Errorf("pipe: %d bytes queued, want 5", n)
	}
	if n := queued(pidfd, s[1]); n != 16 {
		t.Errorf("socket: %d bytes queued, want 16", n)
	}
	if n := queued(pidfd, p[0]); n != 5 {
		t.Errorf("counting took the bytes: %d left", n)
	}
}

func TestTmpfsMounts(t *testing.T) {
	info := `22 1 0:20 / / rw - overlay overlay rw
23 22 0:21 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k
24 23 0:22 / /dev/shm rw - tmpfs shm rw
25 22 0:21 /null /proc/keys rw - tmpfs tmpfs rw
26 22 0:23 / /sys/firmware ro - tmpfs tmpfs ro
27 22 0:24 / /my\040cache rw - tmpfs tmpfs rw
28 23 0:25 / /dev/pts rw - devpts devpts rw
29 23 0:26 / /dev/turnsnap-agent rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k
`
	got := tmpfsMounts([]byte(info))
	want := []string{"/dev", "/dev/shm", "/my cache"}
	if !slices.Equal(got, want) {
		t.Fatalf("tmpfsMounts = %q, want %q", got, want)
	}
}

// A freeze whose holder is gone is stale; one held by a live process is not.
func TestStaleFreeze(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	id := startKeeper(t, rt, busyboxRootfs(t))
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	fs, err := rt.Freeze(id)
	if err != nil || !fs.Frozen || !fs.HolderKnown || fs.Holder.PID != os.Getpid() || fs.Stale() {
		t.Fatalf("freeze by this process: %+v %v", fs, err)
	}
	// The holder file as a killed turnsnap leaves it: a pid that is gone.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	gone := Holder{PID: dead.Process.Pid, Start: 1}
	if err := os.WriteFile(rt.freezeFile(id), []byte(gone.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if fs, _ = rt.Freeze(id); !fs.Stale() {
		t.Fatalf("freeze by a dead process not stale: %+v", fs)
	}
	if err := rt.Resume(context.WithoutCancel(ctx), id); err != nil {
		t.Fatal(err)
	}
	if fs, _ = rt.Freeze(id); fs.Frozen || fs.HolderKnown {
		t.Fatalf("after Resume: %+v", fs)
	}
	if st, _ := rt.Status(id); st != Running {
		t.Fatalf("status after resume: %s", st)
	}
}

// FuzzProcText feeds hostile text to every parser of files proc reads:
// /proc/PID/stat, mountinfo, maps ranges, holder names, the probe cache.
func FuzzProcText(f *testing.F) {
	f.Add([]byte("42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 53967 1000 200 0 0"))
	f.Add([]byte("23 22 0:21 / /dev rw,nosuid - tmpfs tmpfs rw\n27 22 0:24 / /a\\040b rw - tmpfs t rw\n"))
	f.Add([]byte("4242.53967"))
	f.Add([]byte(`{"format":1,"key":["a"],"result":{"runc":"1.1.5","criu":"4.2.1"}}`))
	f.Add([]byte("00400000-00600000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseStat(b)
		for _, m := range tmpfsMounts(b) {
			if criu.PseudoFS(m) {
				t.Fatalf("masked path %q kept", m)
			}
		}
		if h, ok := ParseHolder(string(b)); ok {
			if back, ok2 := ParseHolder(h.String()); !ok2 || back != h {
				t.Fatalf("holder %q does not round-trip", b)
			}
		}
		decodeProbe(b, []string{"a"})
		mapFilesName(string(b))
		unescapeMount(string(b))
	})
}
