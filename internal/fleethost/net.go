// Package fleethost makes a fleet of hosts on one machine for tests: a
// bridge in the root namespace and per host a network namespace with its
// own address, home, home id and `turnsnap serve` (docs/STORAGE.md, "The
// fleet test"). internal/fleet's chaos test and the Kubernetes suite
// (internal/kubetest/kubefleet) both run on it.
package fleethost

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The fleet's network: one bridge in the root namespace holding
// 10.213.X.1/24 (MinIO listens there), and per host a network namespace
// whose veth end is 10.213.X.(10+i)/24 on that bridge. Every name starts
// with namePrefix and the run's id, and the run registers itself in
// registryDir (its pid) before making anything, so that a later run can
// remove what a killed run left (its pid is gone) without touching a run
// still going.
const (
	namePrefix  = "tsf"
	registryDir = "/run/turnsnap-fleet"
)

// Net is one run's network: a bridge and the hosts' namespaces.
type Net struct {
	ID     string // 4 hex digits, in every name this run makes
	Bridge string
	Subnet string // "10.213.X"
	hosts  []string
}

// NSName is the network namespace of host i (1-based).
func (n *Net) NSName(i int) string { return fmt.Sprintf("%s%sh%d", namePrefix, n.ID, i) }

// Gateway is the root namespace's address on the bridge: a server the
// hosts reach (MinIO, the Kubernetes API server) listens there.
func (n *Net) Gateway() string { return n.Subnet + ".1" }

// HostAddr is host i's address (1-based) on the bridge, in its namespace.
func (n *Net) HostAddr(i int) string { return fmt.Sprintf("%s.%d", n.Subnet, 10+i) }

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeLeftovers deletes the namespaces and bridges of earlier runs whose
// process is gone (a run killed before its cleanup ran).
func removeLeftovers(t testing.TB) {
	entries, _ := os.ReadDir(registryDir)
	live := map[string]bool{}
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(registryDir, e.Name()))
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		pid, err := strconv.Atoi(lines[0])
		if err == nil && pid > 0 && alive(pid) {
			live[e.Name()] = true
			continue
		}
		// The dead run's directory: its daemons' overlay roots are still
		// mounted there.
		for _, dir := range lines[1:] {
			if strings.HasPrefix(dir, os.TempDir()+"/") {
				t.Logf("fleet: removing %s of a dead run", dir)
				UnmountUnder(t, dir)
				os.RemoveAll(dir)
			}
		}
		os.Remove(filepath.Join(registryDir, e.Name()))
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], namePrefix) || len(f[0]) < len(namePrefix)+4 {
			continue
		}
		if id := f[0][len(namePrefix) : len(namePrefix)+4]; !live[id] {
			t.Logf("fleet: removing leftover namespace %s of a dead run", f[0])
			_ = ipCmd("netns", "del", f[0])
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if strings.HasPrefix(name, namePrefix) && len(name) >= len(namePrefix)+4 && !live[name[len(namePrefix):len(namePrefix)+4]] {
			t.Logf("fleet: removing leftover bridge %s of a dead run", name)
			_ = ipCmd("link", "del", name)
		}
	}
}

// alive reports whether pid is a running process (a zombie is not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command, which is in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// RegisterDir records dir in this run's registry entry, so that a later
// run removes it if this one dies before its cleanup.
func (n *Net) RegisterDir(dir string) error {
	f, err := os.OpenFile(filepath.Join(registryDir, n.ID), os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "\n%s", dir)
	return err
}

// SetupNet makes the bridge and n namespaces, and removes them when t ends
// (even when it fails).
func SetupNet(t testing.TB, n int) *Net {
	t.Helper()
	if err := os.MkdirAll(registryDir, 0o755); err != nil {
		t.Fatal(err)
	}
	removeLeftovers(t)
	b := make([]byte, 2)
	rand.Read(b)
	fn := &Net{ID: hex.EncodeToString(b)}
	reg := filepath.Join(registryDir, fn.ID)
	if err := os.WriteFile(reg, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(reg) })
	// A /24 no address of this host is in already.
	addrs, _ := exec.Command("ip", "-4", "-o", "addr").Output()
	for range 64 {
		x, _ := rand.Int(rand.Reader, big.NewInt(256))
		cand := fmt.Sprintf("10.213.%d", x.Int64())
		if !strings.Contains(string(addrs), cand+".") {
			fn.Subnet = cand
			break
		}
	}
	if fn.Subnet == "" {
		t.Fatal("fleet: no free 10.213.X.0/24 subnet")
	}
	fn.Bridge = namePrefix + fn.ID + "br"
	t.Cleanup(func() {
		for _, ns := range fn.hosts {
			if err := ipCmd("netns", "del", ns); err != nil {
				t.Errorf("fleet cleanup: %v", err)
			}
		}
		if err := ipCmd("link", "del", fn.Bridge); err != nil {
			t.Errorf("fleet cleanup: %v", err)
		}
	})
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("link", "add", fn.Bridge, "type", "bridge")
	must("addr", "add", fn.Gateway()+"/24", "dev", fn.Bridge)
	must("link", "set", fn.Bridge, "up")
	for i := 1; i <= n; i++ {
		ns := fn.NSName(i)
		must("netns", "add", ns)
		fn.hosts = append(fn.hosts, ns)
		veth := fmt.Sprintf("%s%sv%d", namePrefix, fn.ID, i)
		must("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("link", "set", veth, "master", fn.Bridge)
		must("link", "set", veth, "up")
		must("-n", ns, "addr", "add", fn.HostAddr(i)+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
		must("-n", ns, "link", "set", "lo", "up")
	}
	return fn
}

// InNS returns argv run inside host i's network namespace only: nsenter
// --net keeps the mount namespace (unlike `ip netns exec`, which unshares
// it), so the overlay roots a daemon mounts are the test's to read and
// write, and nsenter execs argv in place, so its pid is the daemon's.
// On a nil Net (hosts sharing the root namespace, as the controller's
// tests run them on 127.0.0.1) argv runs as it is.
func (n *Net) InNS(i int, argv ...string) []string {
	if n == nil {
		return argv
	}
	return append([]string{"nsenter", "--net=/run/netns/" + n.NSName(i), "--"}, argv...)
}
