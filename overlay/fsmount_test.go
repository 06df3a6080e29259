package overlay

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// rootMount returns the mountinfo entry of the root's overlay.
func rootMount(t *testing.T, r *Root) *mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(r.Path()))
	must(t, err)
	if len(ms) != 1 {
		t.Fatalf("%d mounts on the root", len(ms))
	}
	return ms[0]
}

// TestMountHidesHostPaths: the layers are passed as descriptors of
// detached clones, so the overlay's options and source, which every
// process that sees the mount can read (the sandbox's own included), name
// neither the base nor the sandbox directory. Its files are still the
// base's and its writes still land in the upper.
func TestMountHidesHostPaths(t *testing.T) {
	r, dir, lower := newRoot(t, func(lower string) {
		roottest.Write(t, filepath.Join(lower, "f"), "base\n")
	})
	m := rootMount(t, r)
	t.Logf("mountinfo: %s %s", m.Source, m.VFSOptions)
	if !strings.HasPrefix(m.VFSOptions, "rw,"+hiddenLayers+",") {
		t.Errorf("layers not hidden on this kernel (%s): options %q", kernelRelease(), m.VFSOptions)
	}
	for _, host := range []string{lower, dir, filepath.Dir(dir), filepath.Dir(lower)} {
		if strings.Contains(m.VFSOptions, host) || strings.Contains(m.Source, host) {
			t.Errorf("mountinfo names host path %s: source %q options %q", host, m.Source, m.VFSOptions)
		}
	}
	if data, err := os.ReadFile(filepath.Join(r.Path(), "f")); err != nil || string(data) != "base\n" {
		t.Fatalf("the base through the mount: %q, %v", data, err)
	}
	roottest.Write(t, filepath.Join(r.Path(), "new"), "upper\n")
	g, err := r.gen()
	must(t, err)
	if data, err := os.ReadFile(filepath.Join(g, "upper", "new")); err != nil || string(data) != "upper\n" {
		t.Fatalf("a write through the mount is not in the upper: %q, %v", data, err)
	}
	// Remounted (a reboot, a restore): the same layers, the same options.
	must(t, r.Unmount(context.Background()))
	must(t, r.Mount(context.Background()))
	if m2 := rootMount(t, r); m2.VFSOptions != m.VFSOptions || m2.Source != m.Source {
		t.Errorf("remount: %q %q, first mount %q %q", m2.Source, m2.VFSOptions, m.Source, m.VFSOptions)
	}
}

// TestMountFallsBackToPaths: where the kernel refuses layer descriptors
// (before Linux 6.15), the root is mounted with mount(2); the paths show,
// and every option is still pinned and read back.
func TestMountFallsBackToPaths(t *testing.T) {
	testenv.RequireRoot(t)
	lower := filepath.Join(t.TempDir(), "lower")
	must(t, os.Mkdir(lower, 0o755))
	roottest.Write(t, filepath.Join(lower, "f"), "base\n")
	dir := filepath.Join(t.TempDir(), "sb")
	r, err := Create(context.Background(), dir, lower, delta.EmptyTree(), roottest.NewMemStore())
	must(t, err)
	t.Cleanup(func() { r.Remove(context.Background()) })
	must(t, r.Unmount(context.Background()))
	old := Open(dir, lower)
	calls := 0
	old.mountFD = func([]string, string, string) error { calls++; return unix.EINVAL }
	must(t, old.Mount(context.Background()))
	if calls == 0 {
		t.Fatal("the descriptor mount was never tried")
	}
	g, err := old.gen()
	must(t, err)
	m := rootMount(t, old)
	if want := pathLayers(lower, filepath.Join(g, "upper"), filepath.Join(g, "work")); !strings.HasPrefix(m.VFSOptions, "rw,"+want+",") {
		t.Errorf("fallback options %q, want the paths %q", m.VFSOptions, want)
	}
	if m.Source != mountSource(filepath.Join(g, "upper")) {
		t.Errorf("fallback source %q, want %q", m.Source, mountSource(filepath.Join(g, "upper")))
	}
	must(t, checkSuperOptions(m.VFSOptions, pathLayers(lower, filepath.Join(g, "upper"), filepath.Join(g, "work"))))
	if data, err := os.ReadFile(filepath.Join(old.Path(), "f")); err != nil || string(data) != "base\n" {
		t.Fatalf("the base through the fallback mount: %q, %v", data, err)
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown kernel"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// BenchmarkMount compares a mount with layer descriptors (the default)
// with the mount(2) fallback: unmount and mount one root, verification of
// the mount table included.
func BenchmarkMount(b *testing.B) {
	testenv.RequireRoot(b)
	lower := filepath.Join(b.TempDir(), "lower")
	must(b, os.Mkdir(lower, 0o755))
	dir := filepath.Join(b.TempDir(), "sb")
	r, err := Create(context.Background(), dir, lower, delta.EmptyTree(), roottest.NewMemStore())
	must(b, err)
	b.Cleanup(func() { r.Remove(context.Background()) })
	for _, mode := range []string{"descriptors", "paths"} {
		b.Run(mode, func(b *testing.B) {
			root := Open(dir, lower)
			if mode == "paths" {
				root.mountFD = func([]string, string, string) error { return unix.EINVAL }
			}
			for b.Loop() {
				must(b, root.Unmount(context.Background()))
				must(b, root.Mount(context.Background()))
			}
		})
	}
}
