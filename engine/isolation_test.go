package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"golang.org/x/sys/unix"
)

// buildProbe builds testdata/isoprobe static into the test's temp dir.
func buildProbe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "isoprobe")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/isoprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	return bin
}

type probeResult struct {
	Probe   string `json:"probe"`
	Reached bool   `json:"reached"`
	Detail  string `json:"detail"`
}

func parseProbe(t *testing.T, out []byte) map[string]probeResult {
	t.Helper()
	res := map[string]probeResult{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r probeResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("probe output %q: %v", sc.Text(), err)
		}
		res[r.Probe] = r
	}
	return res
}

// countingListener accepts connections on l and counts them.
func countingListener(t *testing.T, network, addr string) (net.Listener, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen(network, addr)
	must(t, err)
	t.Cleanup(func() { l.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return l, &n
}

// hostAddrs are the host's global unicast addresses other than loopback
// (the test listens on each, and the sandbox must reach none).
func hostAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	must(t, err)
	var out []string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if ok && ipn.IP.IsGlobalUnicast() && !ipn.IP.IsLoopback() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

// poolDisk returns MAJOR:MINOR of the block device of the btrfs mounted
// at mnt (a loop device: btrfstest).
func poolDisk(t *testing.T, mnt string) string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt))
	must(t, err)
	if len(ms) != 1 {
		t.Fatalf("%d mounts on %s", len(ms), mnt)
	}
	var st unix.Stat_t
	must(t, unix.Stat(ms[0].Source, &st))
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// TestSandboxSeesNothingOfTheHost runs a probe inside a real sandbox
// container that tries every way out this design closes: the home, the
// daemon's socket in it, another sandbox's root (by its host path, through
// the roots of processes in /proc, by climbing with ..), a host process,
// the host paths in the mount table, an abstract unix socket the host
// listens on, TCP to listeners on the host's loopback and on every other
// host address, the host's network interfaces, and (btrfs) the raw disk
// of the pool through a device node it makes (CAP_MKNOD is granted, the
// device cgroup refuses the open). Every attempt must
// fail and no host listener may see a connection. The same probe run on
// the host must succeed at each, which proves each attempt can detect the
// access it looks for.
func TestSandboxSeesNothingOfTheHost(t *testing.T) {
	requireProcs(t)
	t.Run("overlay", func(t *testing.T) {
		probeIsolation(t, CreateOptions{}, nil, "", func(root string) {
			// The layers are descriptors: no host path (overlay/fsmount.go).
			if !strings.Contains(root, " - overlay turnsnap-") || !strings.Contains(root, "lowerdir+=/,upperdir=/upper,workdir=/work,") {
				t.Errorf("inside: the root mount does not show hidden layers: %s", root)
			}
		})
	})
	t.Run("btrfs", func(t *testing.T) {
		mnt := btrfstest.Pool(t)
		pool := filepath.Join(mnt, "pool")
		must(t, os.Mkdir(pool, 0o700))
		// The pool's disk holds every sandbox on it: CAP_MKNOD lets the
		// sandbox make a node for it, the device cgroup must refuse it.
		// (The host's own disk is no test here: this VM refuses even
		// root on the host to open it.)
		opts := CreateOptions{Backend: btrfs.Name, Btrfs: btrfs.Options{Pool: pool}}
		probeIsolation(t, opts, []string{pool}, poolDisk(t, mnt), func(root string) {
			// A bind of a subvolume shows the subvolume's path inside its
			// filesystem (mountinfo's root field, btrfs's subvol= option)
			// and the block device, never where the filesystem is mounted
			// on the host; docs/SECURITY.md says so.
			if !strings.Contains(root, " - btrfs /dev/") || !strings.Contains(root, "subvol=/pool/sandboxes/a-") {
				t.Errorf("inside: the btrfs root mount is not what docs/SECURITY.md describes: %s", root)
			}
		})
	})
}

// probeIsolation runs the probe in sandbox a of a new home, with sandbox
// b beside it, both made with opts; paths are more host directories the
// sandbox must not see, blockdev ("" for none) a host disk it must not
// read; checkRoot checks the root mount's mountinfo line.
func probeIsolation(t *testing.T, opts CreateOptions, paths []string, blockdev string, checkRoot func(line string)) {
	ctx := context.Background()
	e := newEngine(t)
	home := e.Home()
	opts.Base = busyboxBase(t)
	a, err := e.CreateSandbox(ctx, "a", opts)
	must(t, err)
	b, err := e.CreateSandbox(ctx, "b", opts)
	must(t, err)
	other := filepath.Join(b.Root, "b-secret")
	write(t, other, "sandbox b's file\n")
	_, err = e.Processes().Exec(ctx, "b", []string{"sleep", "100000"}, ExecOptions{Detach: true})
	must(t, err)

	// The daemon's socket is HOME/turnsnap.sock; this test listens there
	// itself.
	sock := filepath.Join(home, "turnsnap.sock")
	_, sockN := countingListener(t, "unix", sock)
	abstract := fmt.Sprintf("turnsnap-isolation-%d", os.Getpid())
	_, abstractN := countingListener(t, "unix", "@"+abstract)
	tcp := map[string]*atomic.Int64{}
	for _, ip := range append([]string{"127.0.0.1", "::1"}, hostAddrs(t)...) {
		l, n := countingListener(t, "tcp", net.JoinHostPort(ip, "0"))
		tcp[l.Addr().String()] = n
	}
	if len(tcp) < 3 {
		t.Logf("no host address beyond loopback: only %v are probed", tcp)
	}

	probe := buildProbe(t)
	bin, err := os.ReadFile(probe)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(a.Root, "isoprobe"), bin, 0o755))
	args := []string{"-home", home, "-other", other, "-sock", sock, "-abstract", abstract,
		"-hostpid", strconv.Itoa(os.Getpid())}
	for addr := range tcp {
		args = append(args, "-tcp", addr)
	}
	for _, p := range paths {
		args = append(args, "-path", p)
	}
	want := []string{"open-home", "open-other-root", "proc-hostpid-root", "proc-any-root", "dotdot-escape",
		"host-process", "mountinfo-home", "unix-socket", "abstract-socket", "interfaces",
		"user-namespace", "net-namespace"}
	for addr := range tcp {
		want = append(want, "tcp "+addr)
	}
	for _, p := range paths {
		want = append(want, "open "+p)
	}
	if blockdev != "" {
		args = append(args, "-blockdev", blockdev)
		want = append(want, "raw-disk")
	}

	// Inside sandbox a: every attempt fails.
	var out, errb bytes.Buffer
	code, err := e.Processes().Exec(ctx, "a", append([]string{"/isoprobe", "-scratch", "/tmp"}, args...), ExecOptions{Stdout: &out, Stderr: &errb})
	if err != nil || code != 0 {
		t.Fatalf("probe in the sandbox: code %d, %v: %s", code, err, errb.String())
	}
	inside := parseProbe(t, out.Bytes())
	for _, p := range want {
		r, ok := inside[p]
		switch {
		case !ok:
			t.Errorf("inside: probe %q did not run", p)
		case r.Reached:
			t.Errorf("inside: the sandbox reached %s: %s", p, r.Detail)
		default:
			t.Logf("inside: %s refused: %s", p, r.Detail)
		}
	}
	// The filter that refuses new namespaces leaves process creation
	// alone (clone3 says ENOSYS, and Go, like libc, falls back to clone).
	if r := inside["exec-plain"]; !r.Reached {
		t.Errorf("inside: the sandbox cannot start a child: %s", r.Detail)
	}
	_, root, _ := strings.Cut(inside["mountinfo-home"].Detail, "root mount: ")
	checkRoot(root)
	counts := func() map[string]int64 {
		m := map[string]int64{"unix-socket": sockN.Load(), "abstract-socket": abstractN.Load()}
		for addr, n := range tcp {
			m["tcp "+addr] = n.Load()
		}
		return m
	}
	for p, n := range counts() {
		if n != 0 {
			t.Errorf("inside: the host listener of %s saw %d connections from the sandbox", p, n)
		}
	}

	// On the host: every attempt succeeds, so each can detect access.
	cmd := exec.Command(probe, append([]string{"-scratch", t.TempDir()}, args...)...)
	cmd.Dir = "/"
	hostOut, err := cmd.Output()
	must(t, err)
	host := parseProbe(t, hostOut)
	for _, p := range want {
		if r, ok := host[p]; !ok || !r.Reached {
			t.Errorf("on the host, probe %q failed (%+v): it cannot tell access from no access", p, r)
		}
	}
	for p, n := range counts() {
		if n == 0 {
			t.Errorf("on the host, the listener of %s saw no connection", p)
		}
	}
}
