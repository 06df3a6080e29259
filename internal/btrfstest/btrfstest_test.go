package btrfstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Pool is a mounted btrfs that takes snapshots, and it is gone (unmounted,
// loop device detached) once the test that made it ends.
func TestPool(t *testing.T) {
	var mnt, dev string
	t.Run("use", func(t *testing.T) {
		mnt = Pool(t)
		var fs unix.Statfs_t
		if err := unix.Statfs(mnt, &fs); err != nil {
			t.Fatal(err)
		}
		if fs.Type != unix.BTRFS_SUPER_MAGIC {
			t.Fatalf("%s is filesystem type %#x, not btrfs", mnt, fs.Type)
		}
		mounted, err := mountinfo.Mounted(mnt)
		if err != nil || !mounted {
			t.Fatalf("%s is not a mount point (%v)", mnt, err)
		}
		mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt))
		if err != nil || len(mounts) != 1 {
			t.Fatalf("mount table entry of %s: %v %v", mnt, mounts, err)
		}
		dev = mounts[0].Source
		// A file and a subvolume snapshot of the top level: btrfs at work.
		if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, "btrfs", "subvolume", "create", filepath.Join(mnt, "sv"))
		run(t, "btrfs", "subvolume", "snapshot", filepath.Join(mnt, "sv"), filepath.Join(mnt, "snap"))
		if _, err := os.Stat(filepath.Join(mnt, "snap")); err != nil {
			t.Fatal(err)
		}
	})
	if t.Failed() || mnt == "" {
		return
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt))
	if err != nil || len(mounts) != 0 {
		t.Fatalf("%s is still mounted after its test ended: %v %v", mnt, mounts, err)
	}
	if out := run(t, "losetup", "--list", "--noheadings", "--output", "NAME"); dev != "" && containsLine(out, dev) {
		t.Fatalf("loop device %s is still attached after its test ended", dev)
	}
}

func containsLine(out, line string) bool {
	return slices.Contains(strings.Fields(out), line)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}
