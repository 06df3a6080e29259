package track

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// trackMask is what a tracker listens for: every change to names, data and
// metadata made through the overlay mount (docs/TRACKING.md).
const trackMask = unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CLOSE_WRITE | unix.FAN_CREATE |
	unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO | unix.FAN_ONDIR

// maxTracked bounds the paths a tracker remembers; past it the next turn
// walks, which costs no more than reading that many paths would.
const maxTracked = 1 << 16

// Walk reasons, as Stats and the engine's counters name them.
const (
	ReasonStart      = "start"      // no scan yet since the tracker started
	ReasonOverflow   = "overflow"   // the kernel queue overflowed (FAN_Q_OVERFLOW)
	ReasonRead       = "read"       // reading or decoding the events failed
	ReasonUnresolved = "unresolved" // an event's file handle did not map to a path
	ReasonTooMany    = "too-many"   // more changed paths than maxTracked
	ReasonLost       = "lost"       // the caller said events may be lost (Lost)
	ReasonHardlink   = "hardlink"   // the tracked scan met a multiply-linked file
	ReasonRemount    = "remount"    // the root is no longer the mount the tracker marked
	ReasonClosed     = "closed"     // the tracker was closed
	ReasonLayout     = "layout"     // the root's layout is one a tracked scan does not read (trackable)
)

// Options configures Start.
type Options struct {
	// NoDrain, for tests, leaves events in the kernel queue until Changes,
	// so a test can overflow it for real.
	NoDrain bool
}

// Stats counts a tracker's events.
type Stats struct {
	Events    uint64
	Overflows uint64
	Stale     uint64 // events on entries already deleted, dropped
	// LastLoss says what last made the record unknown, for logs.
	LastLoss string
}

// Tracker records which paths of one mounted overlay root changed, from a
// fanotify group with a filesystem mark on the overlay's superblock, so a
// turn can scan only those (overlay.Root.ScanTracked). Its record is "since the
// last Reset": Changes returns it (or why it is unknown), Reset starts the
// next one once a scan is committed. Safe for concurrent use.
type Tracker struct {
	fd      int // the fanotify group, non-blocking
	mountFD int // the mount's root, for open_by_handle_at
	prefix  string
	mntID   uint64 // the marked mount's unique id (STATX_MNT_ID_UNIQUE)
	// file wraps fd for Go's poller, so a drain goroutine waits for events
	// without holding an OS thread; it owns (and closes) fd.
	file *os.File
	done chan struct{}

	mu     sync.Mutex
	closed bool
	// taken is what the scan in progress (since the last Reset) builds on;
	// pending is what arrived after its Changes call.
	taken, pending map[string]bool
	// forced and forcePending are paths to read again whatever their
	// stat says (Reread), for the scan in progress and the next one.
	forced, forcePending map[string]bool
	takenWhy, pendingWhy string // why the record is unknown ("" known)
	quiet                int32  // a process whose events are dropped (Quiet); 0 none
	last                 *fstree.ScanResult
	stats                Stats
	buf                  []byte
}

// Start starts recording changes to the overlay mounted at path (the root
// of the sandbox kept in dir, which errors name). Events made before it
// returns are not in the record: the first turn walks (ReasonStart).
func Start(dir, path string, opts Options) (*Tracker, error) {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_DFID_NAME|unix.FAN_REPORT_FID|
		unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_LARGEFILE)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: fanotify_init: %w", dir, err)
	}
	t := &Tracker{fd: fd, mountFD: -1, file: os.NewFile(uintptr(fd), "fanotify"), done: make(chan struct{}),
		taken: map[string]bool{}, pending: map[string]bool{}, takenWhy: ReasonStart,
		forced: map[string]bool{}, forcePending: map[string]bool{},
		buf: make([]byte, 64<<10)}
	// The root's mount options were checked when it was mounted; a mark
	// on anything else (not mounted, or without nfs_export) fails below.
	if mounted, err := mountinfo.Mounted(path); err != nil || !mounted {
		t.closeFDs()
		return nil, fmt.Errorf("sandbox %s: track: root %s is not mounted (%v): %w", dir, path, err, errdefs.ErrPrecondition)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, trackMask, unix.AT_FDCWD, path); err != nil {
		t.closeFDs()
		return nil, fmt.Errorf("sandbox %s: fanotify_mark on %s (needs index=on,nfs_export=on): %w", dir, path, errors.Join(err, errdefs.ErrPrecondition))
	}
	if t.mountFD, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		t.closeFDs()
		return nil, fmt.Errorf("sandbox %s: track: %w", dir, err)
	}
	if t.prefix, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(t.mountFD)); err != nil {
		t.closeFDs()
		return nil, fmt.Errorf("sandbox %s: track: %w", dir, err)
	}
	if t.mntID, err = mountID(t.mountFD, ""); err != nil {
		t.closeFDs()
		return nil, fmt.Errorf("sandbox %s: track: %w", dir, err)
	}
	if opts.NoDrain {
		close(t.done)
		return t, nil
	}
	rc, err := t.file.SyscallConn()
	if err != nil {
		t.closeFDs()
		return nil, fmt.Errorf("sandbox %s: track: %w", dir, err)
	}
	go t.drainLoop(rc)
	return t, nil
}

func (t *Tracker) closeFDs() {
	t.file.Close()
	if t.mountFD >= 0 {
		unix.Close(t.mountFD)
	}
}

// Close stops the tracker. The descriptor it holds on the mount is closed
// before it returns, so the root can be unmounted at once; the fanotify
// group is not waited for: the kernel tears a group down only after an
// SRCU grace period (measured at 10-15 ms on a busy host, most of a
// rollback), and the drain goroutine's last reference closes it.
func (t *Tracker) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	// Under mu: drainLocked and resolve check closed before they touch
	// either descriptor.
	if t.mountFD >= 0 {
		unix.Close(t.mountFD)
	}
	t.fd, t.mountFD = -1, -1
	t.mu.Unlock()
	// os.File.Close waits for the close(2), which waits for the group's
	// teardown: off this goroutine. It wakes the drain goroutine's wait
	// with an error.
	go t.file.Close()
	return nil
}

// drainLoop moves events from the kernel queue into the record as they
// come, so the queue overflows only when a burst outruns it.
// It reads until EAGAIN each time it wakes, as the poller's
// edge-triggered wait needs.
func (t *Tracker) drainLoop(rc syscall.RawConn) {
	defer close(t.done)
	err := rc.Read(func(uintptr) bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed {
			return true
		}
		t.drainLocked()
		return false
	})
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil && !t.closed {
		t.stats.LastLoss = err.Error()
		t.lostLocked(ReasonRead)
	}
}

// drainLocked reads every queued event into pending.
func (t *Tracker) drainLocked() {
	for !t.closed && t.fd >= 0 {
		n, err := unix.Read(t.fd, t.buf)
		if errors.Is(err, unix.EAGAIN) || (err == nil && n == 0) {
			return
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.lostLocked(ReasonRead)
			return
		}
		if err := decodeEvents(t.buf[:n], t.eventLocked); err != nil {
			t.stats.LastLoss = err.Error()
			t.lostLocked(ReasonRead)
		}
	}
}

func (t *Tracker) lostLocked(why string) {
	if t.pendingWhy == "" {
		t.pendingWhy = why
	}
	clear(t.pending)
}

// eventLocked adds the paths one event names.
func (t *Tracker) eventLocked(ev rawEvent) error {
	t.stats.Events++
	if ev.Mask&unix.FAN_Q_OVERFLOW != 0 {
		t.stats.Overflows++
		t.lostLocked(ReasonOverflow)
		return nil
	}
	if t.pendingWhy != "" {
		return nil // already unknown until the next Reset
	}
	if t.quiet != 0 && ev.Pid == t.quiet {
		return nil // the caller's own writes (Quiet)
	}
	named := false
	for _, rec := range ev.Records {
		if rec.Kind == infoDFIDName || rec.Kind == infoOldDFIDName || rec.Kind == infoNewDFIDName {
			named = true
			dir, ok, err := t.resolve(rec)
			if err != nil {
				t.stats.LastLoss = err.Error()
				t.lostLocked(ReasonUnresolved)
				return nil
			}
			if !ok {
				t.stats.Stale++
				continue
			}
			if rec.Name == "." {
				t.addLocked(dir)
			} else {
				t.addLocked(path.Join(dir, rec.Name))
			}
		}
	}
	if named {
		return nil
	}
	// An event without a name (a link count change) names the object by
	// its own handle: map it to one of its names.
	for _, rec := range ev.Records {
		if rec.Kind != infoFID && rec.Kind != infoDFID {
			continue
		}
		p, ok, err := t.resolve(rec)
		if err != nil {
			t.stats.LastLoss = err.Error()
			t.lostLocked(ReasonUnresolved)
			return nil
		}
		if ok {
			t.addLocked(p)
		} else {
			t.stats.Stale++
		}
		return nil
	}
	t.lostLocked(ReasonUnresolved) // no record we can place
	return nil
}

func (t *Tracker) addLocked(p string) {
	if len(t.pending) >= maxTracked {
		t.lostLocked(ReasonTooMany)
		return
	}
	t.pending[p] = true
}

// resolve maps a file handle of the overlay to its root-relative path now.
// ok=false: the object no longer exists (ESTALE, or unlinked), so the
// event is covered by the delete event of its last name, which names the
// parent. Any other failure is an error: the record becomes unknown.
func (t *Tracker) resolve(rec fidRecord) (string, bool, error) {
	fh := unix.NewFileHandle(rec.HandleType, rec.Handle)
	fd, err := unix.OpenByHandleAt(t.mountFD, fh, unix.O_PATH|unix.O_CLOEXEC)
	if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("open_by_handle_at: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", false, err
	}
	if st.Nlink == 0 {
		return "", false, nil
	}
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", false, err
	}
	if p == t.prefix {
		return "", true, nil
	}
	rel, ok := strings.CutPrefix(p, t.prefix+"/")
	if !ok || t.prefix == "/" {
		return "", false, fmt.Errorf("handle resolved to %q, outside %s", p, t.prefix)
	}
	return rel, true, nil
}

// mountID is the never-reused id of the mount holding name below dirFD
// ("" for dirFD itself).
func mountID(dirFD int, name string) (uint64, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var stx unix.Statx_t
	if err := unix.Statx(dirFD, name, flags, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return 0, fmt.Errorf("statx: %w", err)
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return 0, fmt.Errorf("statx: no unique mount id: %w", errdefs.ErrPrecondition)
	}
	return stx.Mnt_id, nil
}

// Watches reports whether t still marks the mount at path (a root's): a
// root unmounted and mounted again (a restore) is another superblock, whose
// changes t never sees.
func (t *Tracker) Watches(path string) bool {
	id, err := mountID(unix.AT_FDCWD, path)
	t.mu.Lock()
	defer t.mu.Unlock()
	return err == nil && !t.closed && id == t.mntID
}
