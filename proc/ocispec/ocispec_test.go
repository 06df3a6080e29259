package ocispec

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestSpecHoldsNoHostPaths(t *testing.T) {
	s := Sandbox("/srv/sandbox/root", "/run/ts/netns/a", "/turnsnap/abc-a", Params{Init: []string{"/bin/sh"}})
	if s.Root.Path != "/srv/sandbox/root" || s.Root.Readonly || s.Process.Terminal {
		t.Errorf("root %+v terminal %v", s.Root, s.Process.Terminal)
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" || strings.HasPrefix(m.Source, "/") {
			t.Errorf("mount %+v reaches into the host", m)
		}
		if m.Destination == "/tmp" {
			t.Error("/tmp must stay in the sandbox root")
		}
	}
	i := slices.IndexFunc(s.Mounts, func(m Mount) bool { return m.Destination == AgentStateDir })
	if i < 0 || s.Mounts[i].Type != "tmpfs" || !strings.HasPrefix(AgentStateDir, "/dev/") ||
		slices.IndexFunc(s.Mounts, func(m Mount) bool { return m.Destination == "/dev" }) > i {
		t.Errorf("mounts %+v: want the agent's tmpfs %s, mounted after /dev (its mount point is not in the root)", s.Mounts, AgentStateDir)
	}
	var ns []string
	for _, n := range s.Linux.Namespaces {
		ns = append(ns, n.Type)
		if (n.Path != "") != (n.Type == "network") || n.Type == "network" && n.Path != "/run/ts/netns/a" {
			t.Errorf("namespace %+v: only the network one is turnsnap's, at its path", n)
		}
	}
	slices.Sort(ns)
	if !slices.Equal(ns, []string{"cgroup", "ipc", "mount", "network", "pid", "uts"}) {
		t.Errorf("namespaces %v", ns)
	}
	if sc := s.Linux.Seccomp; sc == nil || sc.DefaultAction != "SCMP_ACT_ALLOW" || !slices.Contains(sc.Syscalls[0].Names, "unshare") ||
		*sc.Syscalls[0].ErrnoRet != 1 || sc.Syscalls[1].Names[0] != "clone3" || *sc.Syscalls[1].ErrnoRet != 38 {
		t.Errorf("seccomp %+v: want the deny list, EPERM, and ENOSYS for clone3", sc)
	}
	if !slices.Equal(s.Process.Args, []string{"/bin/sh"}) || !s.Process.NoNewPrivileges {
		t.Errorf("process %+v: the init given, no new privileges", s.Process)
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}
}
