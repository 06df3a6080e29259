// Package btrfstest gives tests a real btrfs filesystem: a sparse image file
// formatted with mkfs.btrfs and loop-mounted in the test's temp dir. It is
// torn down in t.Cleanup even when the test fails, so no mount or loop
// device outlives the test.
package btrfstest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// ImageSize is the sparse image's size: big enough for the 50,000-file
// benchmark base plus its snapshots, and free until written.
const ImageSize = 4 << 30

// Pool returns the mount point of a fresh btrfs filesystem for t. It needs
// root, mkfs.btrfs (btrfs-progs) and losetup; a missing part skips t, or
// fails it under `make test`.
func Pool(t testing.TB) string {
	t.Helper()
	testenv.RequireRoot(t)
	for _, tool := range []string{"mkfs.btrfs", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool, "btrfs tests format and loop-mount an image (scripts/deps.d/20-btrfs.sh installs it)")
		}
	}
	for _, dev := range []string{"/dev/loop-control", "/dev/btrfs-control"} {
		if _, err := os.Stat(dev); err != nil {
			testenv.Missing(t, dev, "btrfs tests loop-mount an image")
		}
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "pool.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(ImageSize); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	run(t, "mkfs.btrfs", "-q", img)
	dev := strings.TrimSpace(run(t, "losetup", "--find", "--show", img))
	t.Cleanup(func() { detach(t, dev) })
	if err := unix.Mount(dev, mnt, "btrfs", 0, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", dev, mnt, err)
	}
	t.Cleanup(func() { unmountAll(t, dev) })
	return mnt
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out.String()
}

// unmountAll unmounts every mount of the loop device, including bind mounts
// of its subvolumes a failed test left behind, deepest first.
func unmountAll(t testing.TB, dev string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Errorf("stat %s: %v", dev, err)
		return
	}
	major, minor := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Errorf("mount table: %v", err)
		return
	}
	// btrfs reports an anonymous device per filesystem, not the loop
	// device: match by source too.
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if m.Source != dev && !(m.Major == major && m.Minor == minor) {
			continue
		}
		if err := unix.Unmount(m.Mountpoint, 0); err != nil {
			if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", m.Mountpoint, err)
			}
		}
	}
}

func detach(t testing.TB, dev string) {
	t.Helper()
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Errorf("losetup -d %s: %v: %s", dev, err, out)
	}
}
