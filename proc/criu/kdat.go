package criu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// CRIU's kernel-data cache.
//
// Every CRIU run first probes the kernel ("kerndat": pagemap, userfaultfd,
// netns and veth support, the vDSO, iptables...), forking test processes
// and helpers: about 140 ms here, and in a dump it happens after runc
// has started CRIU, so inside the sandbox's pause. CRIU keeps the answers in
// /run/criu.kdat, but only when /run is a tmpfs (so that a reboot, perhaps
// into another kernel, drops them). On these machines /run is on the root
// filesystem, CRIU refuses to keep the file there, and every dump and
// restore probes again (dump.log: "File /run/criu.kdat does not exist").
//
// So turnsnap keeps the cache for it, as CRIU would on a tmpfs /run: CRIU
// itself writes the file (a `criu check` in a private mount namespace in
// which a root-only directory of the /dev/shm tmpfs is mounted on /run),
// and /run/criu.kdat becomes a symbolic link to it. CRIU opens the cache
// through the link; a reboot empties /dev/shm, the link then names
// nothing, and CRIU probes afresh until turnsnap makes the file again. A
// cache file of another CRIU version is refused by CRIU itself (its size
// and magic), which then removes the link. An existing /run/criu.kdat that
// is not turnsnap's link (a host whose /run is a tmpfs, another tool's) is
// left alone.

// KdatPath is where CRIU (KDAT_RUNDIR, built in) looks for its cache.
const KdatPath = "/run/criu.kdat"

// kdatDir is the root-only tmpfs directory that holds KdatFile.
const kdatDir = "/dev/shm/turnsnap-criu"

// KdatFile is the cache file turnsnap's link at KdatPath names.
const KdatFile = kdatDir + "/criu.kdat"

// KdatState says what EnsureKdat found or did.
type KdatState string

const (
	KdatNative  KdatState = "native"  // /run is a tmpfs: CRIU keeps its own cache
	KdatLinked  KdatState = "linked"  // turnsnap's link names a cache file
	KdatMade    KdatState = "made"    // the cache was made now and linked
	KdatForeign KdatState = "foreign" // /run/criu.kdat is someone else's: left alone
)

// EnsureKdat makes sure the CRIU at criuPath, run with env, finds a
// kernel-data cache (see above). Its errors should fail nothing: a cache
// that cannot be kept only costs each CRIU run its probe.
func EnsureKdat(ctx context.Context, criuPath string, env []string) (KdatState, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(KdatPath), &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		return KdatNative, nil
	}
	if st, done := kdatLinked(); done {
		return st, nil
	}
	if err := privateTmpfsDir(kdatDir); err != nil {
		return "", err
	}
	// One maker at a time on the host: two would remove each other's file,
	// and the loser's CRIU finds the other's temporary file and keeps
	// nothing.
	lock, err := os.OpenFile(filepath.Join(kdatDir, "lock"), os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	if st, done := kdatLinked(); done {
		return st, nil
	}
	// CRIU writes the file itself, so its layout is always CRIU's own. A
	// temporary file a failed save left behind would stop it (CRIU opens
	// it O_EXCL and, on failure, removes the cache instead of it).
	os.Remove(KdatFile)
	os.Remove(KdatFile + ".tmp")
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", `mount --bind "$1" /run && exec "$2" check`, "sh", kdatDir, criuPath)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go makes / private in it first
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("CRIU kernel-data cache: criu check: %v: %s", err, QuoteLines(ErrorLines(string(out))))
	}
	if fi, err := os.Stat(KdatFile); err != nil || fi.Size() == 0 {
		return "", fmt.Errorf("CRIU kernel-data cache: criu check wrote no %s", KdatFile)
	}
	tmp := KdatPath + ".turnsnap." + strconv.Itoa(os.Getpid())
	os.Remove(tmp)
	if err := os.Symlink(KdatFile, tmp); err != nil {
		return "", fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	// Replace only what was checked above: nothing, or turnsnap's link.
	if err := os.Rename(tmp, KdatPath); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	return KdatMade, nil
}

// kdatLinked says whether the cache needs no work: turnsnap's link names a
// cache file (KdatLinked), or /run/criu.kdat is someone else's
// (KdatForeign). A missing link, or turnsnap's naming nothing, needs the
// file made.
func kdatLinked() (KdatState, bool) {
	switch link, err := os.Readlink(KdatPath); {
	case err == nil && link == KdatFile:
		if fi, err := os.Stat(link); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
			return KdatLinked, true
		}
		return "", false
	case errors.Is(err, fs.ErrNotExist):
		return "", false
	default: // a file, or a link of someone else's
		return KdatForeign, true
	}
}

// privateTmpfsDir makes dir (0700, root's) on a tmpfs, or checks that the
// one there is exactly that: another user's directory in the world-writable
// /dev/shm could feed CRIU a cache of its choosing.
func privateTmpfsDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	var fi unix.Stat_t
	if err := unix.Lstat(dir, &fi); err != nil {
		return fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("CRIU kernel-data cache: %w", err)
	}
	if fi.Mode&unix.S_IFMT != unix.S_IFDIR || fi.Uid != 0 || fi.Mode&0o077 != 0 || st.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("CRIU kernel-data cache: %s is not a root-only directory on a tmpfs; not using it", dir)
	}
	return nil
}
