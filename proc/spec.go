package proc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc/ocispec"
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

// specFor is the container's config for start options o (ocispec.Sandbox
// with o's defaults).
func specFor(rootfs, netns, cgroups string, o StartOptions) ocispec.Spec {
	o = o.withDefaults()
	return ocispec.Sandbox(rootfs, netns, cgroups, ocispec.Params{Hostname: o.Hostname, Env: o.Env, Init: o.Init})
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
	b, err := json.MarshalIndent(specFor(abs, r.netnsPath(id), r.cgroupsPath(id), o), "", "\t")
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
