// Command isoprobe tries, from wherever it runs, each way a sandbox could
// reach the host it should not, and prints one JSON line per attempt:
// {"probe": NAME, "reached": BOOL, "detail": TEXT}. The isolation tests
// (engine/isolation_test.go) run it inside a sandbox's container, where
// every attempt must fail, and on the host, where every attempt must
// succeed, which proves each attempt can detect the access it looks for.
//
// It is built static (CGO_ENABLED=0) by the test and copied into the
// sandbox root; it uses only the standard library.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type result struct {
	Probe   string `json:"probe"`
	Reached bool   `json:"reached"`
	Detail  string `json:"detail"`
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	home := flag.String("home", "", "the turnsnap home (a directory)")
	other := flag.String("other", "", "a file inside another sandbox's root, by its host path")
	sock := flag.String("sock", "", "a unix socket on the host (the daemon's)")
	abstract := flag.String("abstract", "", "an abstract unix socket name the host listens on")
	hostPID := flag.Int("hostpid", 0, "a host process (the test binary: its command line holds -test.)")
	blockdev := flag.String("blockdev", "", "MAJOR:MINOR of a host block device to read through a node made here (the disk of a btrfs pool)")
	scratch := flag.String("scratch", "", "a directory this run may create a device node in")
	var tcp, paths multi
	flag.Var(&tcp, "tcp", "a TCP address the host listens on (repeatable)")
	flag.Var(&paths, "path", "another host directory the sandbox must not see, e.g. a btrfs pool (repeatable)")
	noop := flag.Bool("noop", false, "exit at once (the child of the namespace probes)")
	flag.Parse()
	if *noop {
		return
	}

	out := json.NewEncoder(os.Stdout)
	emit := func(probe string, err error, detail string) {
		r := result{Probe: probe, Reached: err == nil, Detail: detail}
		if err != nil {
			r.Detail = err.Error()
		}
		out.Encode(r)
	}

	ents, err := os.ReadDir(*home)
	emit("open-home", err, fmt.Sprintf("%d entries", len(ents)))
	for _, p := range paths {
		ents, err := os.ReadDir(p)
		emit("open "+p, err, fmt.Sprintf("%d entries", len(ents)))
	}
	_, err = os.ReadFile(*other)
	emit("open-other-root", err, "read")
	_, err = os.ReadFile(fmt.Sprintf("/proc/%d/root%s", *hostPID, *other))
	emit("proc-hostpid-root", err, "read")
	emit(anyProcRoot(*other))
	// A relative path climbing far above the cwd: ".." at / stays at /.
	_, err = os.ReadFile(strings.Repeat("../", 64) + strings.TrimPrefix(*other, "/"))
	emit("dotdot-escape", err, "read")
	emit(hostProcess(*hostPID))
	emit(mountinfoLeak(append([]string{*home}, paths...)))

	c, err := net.DialTimeout("unix", *sock, 2*time.Second)
	if err == nil {
		c.Close()
	}
	emit("unix-socket", err, "connected")
	c, err = net.DialTimeout("unix", "@"+*abstract, 2*time.Second)
	if err == nil {
		c.Close()
	}
	emit("abstract-socket", err, "connected")
	for _, a := range tcp {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err == nil {
			c.Close()
		}
		emit("tcp "+a, err, "connected")
	}
	emit(interfaces())
	emit("exec-plain", child(0), "a child ran")
	emit("user-namespace", child(syscall.CLONE_NEWUSER), "a child ran in a new user namespace")
	emit("net-namespace", child(syscall.CLONE_NEWNET), "a child ran in a new network namespace")
	if *blockdev != "" {
		emit(rawDisk(*blockdev, *scratch))
	}
}

// child runs this program again with -noop, in new namespaces if flags
// says so. A new user namespace needs no capability: only the seccomp
// filter stops it.
func child(flags uintptr) error {
	cmd := exec.Command("/proc/self/exe", "-noop")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	return cmd.Run()
}

// rawDisk makes a node for a host disk and reads its first block:
// whoever reads the disk reads every sandbox on it.
func rawDisk(dev, scratch string) (string, error, string) {
	var major, minor uint32
	if _, err := fmt.Sscanf(dev, "%d:%d", &major, &minor); err != nil {
		return "raw-disk", fmt.Errorf("-blockdev %q: %v", dev, err), ""
	}
	node := filepath.Join(scratch, "isoprobe-disk")
	os.Remove(node)
	if err := syscall.Mknod(node, syscall.S_IFBLK|0o600, int(major<<8|minor&0xff|(minor&^0xff)<<12)); err != nil {
		return "raw-disk", fmt.Errorf("mknod: %w", err), ""
	}
	defer os.Remove(node)
	f, err := os.Open(node)
	if err != nil {
		return "raw-disk", err, ""
	}
	defer f.Close()
	n, err := f.Read(make([]byte, 4096))
	return "raw-disk", err, fmt.Sprintf("read %d bytes of %s", n, dev)
}

// anyProcRoot tries the other sandbox's file through the root of every
// process this one can see.
func anyProcRoot(other string) (string, error, string) {
	roots, _ := filepath.Glob("/proc/[0-9]*/root")
	for _, r := range roots {
		if _, err := os.ReadFile(r + other); err == nil {
			return "proc-any-root", nil, "through " + r
		}
	}
	return "proc-any-root", fmt.Errorf("not through any of %d process roots", len(roots)), ""
}

// hostProcess looks for a host process (the test binary) in /proc.
func hostProcess(pid int) (string, error, string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "host-process", err, ""
	}
	if !strings.Contains(string(b), "-test.") {
		return "host-process", fmt.Errorf("pid %d is not the host's test binary", pid), ""
	}
	return "host-process", nil, "pid visible"
}

// mountinfoLeak reads the mount table for any of the host paths; it
// prints the root mount's line either way.
func mountinfoLeak(hostPaths []string) (string, error, string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "mountinfo-home", err, ""
	}
	var root string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "/" {
			root = l
		}
	}
	for _, p := range hostPaths {
		if strings.Contains(string(b), p) {
			return "mountinfo-home", nil, p + " in the mount table; root mount: " + root
		}
	}
	return "mountinfo-home", fmt.Errorf("no host path in the mount table; root mount: %s", root), ""
}

// interfaces lists the network interfaces other than loopback.
func interfaces() (string, error, string) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "interfaces", err, ""
	}
	var all, others []string
	for _, i := range ifs {
		all = append(all, i.Name)
		if i.Flags&net.FlagLoopback == 0 {
			others = append(others, i.Name)
		}
	}
	if len(others) == 0 {
		return "interfaces", fmt.Errorf("only %v", all), ""
	}
	return "interfaces", nil, strings.Join(others, ",")
}
