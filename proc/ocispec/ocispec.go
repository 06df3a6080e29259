// Package ocispec is the subset of the OCI runtime spec (1.0.2, what runc
// speaks) that turnsnap writes for a sandbox's container, and the policy it
// writes there: private kernel filesystems only, no host bind, Docker's
// default capabilities, a device deny list and a seccomp filter
// (docs/SECURITY.md, "The sandbox and the host"). Package proc writes it
// into each container's bundle.
package ocispec

// Params are what a container's config takes from its start options.
type Params struct {
	Hostname string
	Env      []string
	Init     []string
}

// The subset of the OCI runtime spec (1.0.2, what runc 1.1.5 speaks) that
// turnsnap writes; runc fills in the rest (default devices, loopback).
type Spec struct {
	OCIVersion  string            `json:"ociVersion"`
	Process     Process           `json:"process"`
	Root        Root              `json:"root"`
	Hostname    string            `json:"hostname"`
	Mounts      []Mount           `json:"mounts"`
	Linux       Linux             `json:"linux"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type Process struct {
	Terminal        bool     `json:"terminal"`
	User            User     `json:"user"`
	Args            []string `json:"args"`
	Env             []string `json:"env"`
	Cwd             string   `json:"cwd"`
	Capabilities    Caps     `json:"capabilities"`
	NoNewPrivileges bool     `json:"noNewPrivileges"`
}

type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type Caps struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type Root struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type Linux struct {
	CgroupsPath   string      `json:"cgroupsPath,omitempty"`
	Namespaces    []Namespace `json:"namespaces"`
	Resources     Resources   `json:"resources"`
	MaskedPaths   []string    `json:"maskedPaths"`
	ReadonlyPaths []string    `json:"readonlyPaths"`
	Seccomp       *Seccomp    `json:"seccomp,omitempty"`
}

type Namespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type Resources struct {
	Devices []DeviceRule `json:"devices"`
}

type DeviceRule struct {
	Allow  bool   `json:"allow"`
	Access string `json:"access"`
}

// AgentStateDir is a tmpfs of its own in every sandbox container, for the
// state of an agent that runs inside its sandbox (HOME, TMPDIR, its config
// directory: docs/PROCESSES.md, "The agent's own processes"). It is not
// sandbox state: its mount point is in the /dev tmpfs, not in the sandbox
// root, so the file scan never sees it; package proc leaves it out of the
// tmpfs digests that decide process checkpoints and empties it after a
// restore, so nothing of the agent's own state survives a rollback.
const AgentStateDir = "/dev/turnsnap-agent"

// sandboxCaps is Docker's default capability set: enough for an agent to
// install packages (chown, setuid, mknod) without owning the host.
var sandboxCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Sandbox builds a sandbox container's config. Every mount is a fresh kernel
// filesystem private to the container; none is a bind of a host path, so
// CRIU dumps the mount namespace whole and no host file is reachable from
// a process's fds. The network namespace (netns, made by package proc) is the
// container's own with only loopback: the sandbox's servers are reachable
// from inside only, two restores of one image can listen on the same port
// side by side, and CRIU has no host interface to lock or recreate. There is no /tmp tmpfs on purpose: /tmp
// belongs to the sandbox root, which turnsnap checkpoints as files.
//
// cgroups is the container's cgroup path on every controller (see
// proc's Runtime.cgroupsPath): runc's default, the bare id, would put the
// containers of two state roots with the same id into one cgroup. The
// container has its own cgroup namespace, rooted there, so its
// /proc/self/cgroup reads "/" instead of naming the host's hierarchy, the
// home's scope and the sandbox (CRIU dumps and restores the namespace).
//
// What the sandbox can and cannot see of the host is in docs/SECURITY.md
// ("The sandbox and the host"); engine.TestSandboxSeesNothingOfTheHost
// probes it from inside a container.
func Sandbox(rootfs, netns, cgroups string, p Params) Spec {
	return Spec{
		OCIVersion: "1.0.2",
		Process: Process{
			Args:            p.Init,
			Env:             p.Env,
			Cwd:             "/",
			Capabilities:    Caps{Bounding: sandboxCaps, Effective: sandboxCaps, Permitted: sandboxCaps},
			NoNewPrivileges: true,
		},
		Root:     Root{Path: rootfs},
		Hostname: p.Hostname,
		Mounts: []Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
				Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
				Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			// The agent's own state (AgentStateDir): after /dev, so its
			// mount point is made in the /dev tmpfs, not in the sandbox root.
			{Destination: AgentStateDir, Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs",
				Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: Linux{
			CgroupsPath: cgroups,
			Namespaces: []Namespace{{Type: "pid"}, {Type: "network", Path: netns}, {Type: "cgroup"},
				{Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			// Deny every device, then runc allows its defaults (null, zero,
			// full, random, urandom, tty, ptmx), which it also creates in /dev.
			Resources: Resources{Devices: []DeviceRule{{Allow: false, Access: "rwm"}}},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
				"/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			Seccomp:       sandboxSeccomp(),
		},
	}
}
