package loopfs

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Mount gives a mounted ext4 of its own, which is gone (unmounted, loop
// device detached) once the test that made it ends.
func TestMountExt4(t *testing.T) {
	var mnt, dev string
	t.Run("use", func(t *testing.T) {
		mnt = Mount(t, "ext4", 64<<20, "-q")
		var fs unix.Statfs_t
		if err := unix.Statfs(mnt, &fs); err != nil {
			t.Fatal(err)
		}
		if fs.Type != unix.EXT4_SUPER_MAGIC {
			t.Fatalf("%s is filesystem type %#x, not ext4", mnt, fs.Type)
		}
		mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt))
		if err != nil || len(mounts) != 1 {
			t.Fatalf("mount table entry of %s: %v %v", mnt, mounts, err)
		}
		dev = mounts[0].Source
	})
	if t.Failed() || mnt == "" {
		return
	}
	if mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt)); err != nil || len(mounts) != 0 {
		t.Fatalf("%s is still mounted after its test ended: %v %v", mnt, mounts, err)
	}
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME").Output()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(strings.Fields(string(out)), dev) {
		t.Fatalf("loop device %s is still attached after its test ended", dev)
	}
}
