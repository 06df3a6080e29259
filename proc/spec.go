package proc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// KeeperScript is the default container init (run by /bin/sh -c): it drops
// runc's stdio for the container's own /dev/null first (a container process
// holding a host file cannot be dumped), then only sleeps and reaps the
// orphans that pid 1 inherits. The marker word lets Snapshot recognise it.
const KeeperScript = `exec </dev/null >/dev/null 2>&1; : turnsnap-keeper; ` +
	`trap 'exit 0' TERM; while :; do sleep 3600 & wait; done`

// keeperMarker is in the keeper's command line and nowhere else.
const keeperMarker = "turnsnap-keeper"

// StartOptions shape a container. The zero value works: the keeper as init,
// hostname "sandbox", a standard PATH. Restore recreates a container with
// the options its image was dumped with (ImageMeta.Options).
type StartOptions struct {
	// Hostname inside the container's uts namespace; default "sandbox".
	Hostname string `json:"hostname,omitempty"`
	// Env is the environment of the init and of every Exec; default
	// PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin and
	// HOME=/root.
	Env []string `json:"env,omitempty"`
	// Init is the container's init; default /bin/sh -c KeeperScript, so the
	// rootfs needs a /bin/sh with sleep (busybox or a distribution's). A
	// replacement must redirect its own stdio inside the container at once
	// (Start fails if it keeps runc's), reap orphans, and never exit.
	Init []string `json:"init,omitempty"`
}

func (o StartOptions) withDefaults() StartOptions {
	if o.Hostname == "" {
		o.Hostname = "sandbox"
	}
	if len(o.Env) == 0 {
		o.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	}
	if len(o.Init) == 0 {
		o.Init = []string{"/bin/sh", "-c", KeeperScript}
	}
	return o
}

// The subset of the OCI runtime spec (1.0.2, what runc 1.1.5 speaks) that
// turnsnap writes; runc fills in the rest (default devices, loopback).
type ociSpec struct {
	OCIVersion  string            `json:"ociVersion"`
	Process     ociProcess        `json:"process"`
	Root        ociRoot           `json:"root"`
	Hostname    string            `json:"hostname"`
	Mounts      []ociMount        `json:"mounts"`
	Linux       ociLinux          `json:"linux"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociProcess struct {
	Terminal        bool     `json:"terminal"`
	User            ociUser  `json:"user"`
	Args            []string `json:"args"`
	Env             []string `json:"env"`
	Cwd             string   `json:"cwd"`
	Capabilities    ociCaps  `json:"capabilities"`
	NoNewPrivileges bool     `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCaps struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	CgroupsPath   string         `json:"cgroupsPath,omitempty"`
	Namespaces    []ociNamespace `json:"namespaces"`
	Resources     ociResources   `json:"resources"`
	MaskedPaths   []string       `json:"maskedPaths"`
	ReadonlyPaths []string       `json:"readonlyPaths"`
	Seccomp       *ociSeccomp    `json:"seccomp,omitempty"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type ociResources struct {
	Devices []ociDeviceRule `json:"devices"`
}

type ociDeviceRule struct {
	Allow  bool   `json:"allow"`
	Access string `json:"access"`
}

// sandboxCaps is Docker's default capability set: enough for an agent to
// install packages (chown, setuid, mknod) without owning the host.
var sandboxCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// makeSpec builds the container's config. Every mount is a fresh kernel
// filesystem private to the container; none is a bind of a host path, so
// CRIU dumps the mount namespace whole and no host file is reachable from
// a process's fds. The network namespace (netns, see netns.go) is the
// container's own with only loopback: the sandbox's servers are reachable
// from inside only, two restores of one image can listen on the same port
// side by side, and CRIU has no host interface to lock or recreate. There is no /tmp tmpfs on purpose: /tmp
// belongs to the sandbox root, which turnsnap checkpoints as files.
//
// cgroups is the container's cgroup path on every controller (see
// Runtime.cgroupsPath): runc's default, the bare id, would put the
// containers of two state roots with the same id into one cgroup. The
// container has its own cgroup namespace, rooted there, so its
// /proc/self/cgroup reads "/" instead of naming the host's hierarchy, the
// home's scope and the sandbox (CRIU dumps and restores the namespace).
//
// What the sandbox can and cannot see of the host is in docs/SECURITY.md
// ("The sandbox and the host"); engine.TestSandboxSeesNothingOfTheHost
// probes it from inside a container.
func makeSpec(rootfs, netns, cgroups string, o StartOptions) ociSpec {
	o = o.withDefaults()
	return ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			Args:            o.Init,
			Env:             o.Env,
			Cwd:             "/",
			Capabilities:    ociCaps{Bounding: sandboxCaps, Effective: sandboxCaps, Permitted: sandboxCaps},
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: rootfs},
		Hostname: o.Hostname,
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
				Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
				Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs",
				Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: ociLinux{
			CgroupsPath: cgroups,
			Namespaces: []ociNamespace{{Type: "pid"}, {Type: "network", Path: netns}, {Type: "cgroup"},
				{Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			// Deny every device, then runc allows its defaults (null, zero,
			// full, random, urandom, tty, ptmx), which it also creates in /dev.
			Resources: ociResources{Devices: []ociDeviceRule{{Allow: false, Access: "rwm"}}},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
				"/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			Seccomp:       sandboxSeccomp(),
		},
	}
}

// writeBundle creates id's network namespace and writes its bundle (a
// directory holding config.json) for rootfs, and returns the bundle's path.
// Delete undoes both.
func (r *Runtime) writeBundle(id, rootfs string, o StartOptions) (string, error) {
	abs, err := filepath.Abs(rootfs)
	if err != nil {
		return "", fmt.Errorf("container %s: rootfs %s: %w", id, rootfs, err)
	}
	// Callers have checked that runc knows no container id: anything left
	// under its name is from an operation that died midway.
	if err := removeNetns(r.netnsPath(id)); err != nil {
		return "", fmt.Errorf("container %s: %w", id, err)
	}
	if err := newNetns(r.netnsPath(id)); err != nil {
		return "", fmt.Errorf("container %s: %w", id, err)
	}
	b, err := json.MarshalIndent(makeSpec(abs, r.netnsPath(id), r.cgroupsPath(id), o), "", "\t")
	if err != nil {
		return "", fmt.Errorf("container %s: config: %w", id, err)
	}
	dir := r.bundle(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("container %s: bundle: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return "", fmt.Errorf("container %s: bundle: %w", id, err)
	}
	ob, err := json.Marshal(o)
	if err != nil {
		return "", fmt.Errorf("container %s: options: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, optionsFile), ob, 0o600); err != nil {
		return "", fmt.Errorf("container %s: bundle: %w", id, err)
	}
	return dir, nil
}

// optionsFile keeps a container's StartOptions in its bundle, for the
// ImageMeta of its dumps.
const optionsFile = "turnsnap-options.json"

// readOptions returns the StartOptions container id was created with.
func (r *Runtime) readOptions(id string) (StartOptions, error) {
	var o StartOptions
	b, err := os.ReadFile(filepath.Join(r.bundle(id), optionsFile))
	if err != nil {
		return o, fmt.Errorf("container %s: options: %w", id, err)
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return o, fmt.Errorf("container %s: options: %v: %w", id, err, errdefs.ErrCorrupt)
	}
	return o, nil
}
