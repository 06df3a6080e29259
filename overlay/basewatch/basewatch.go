// Package basewatch tells whether a materialised base directory may have
// changed since it was last checked, without walking it: a Watch is a
// fanotify notification group with an inode mark on every directory of
// the base, listening for what changes a tree (a child's content,
// metadata, a name created, deleted or moved, a directory removed). Any
// event, or the loss of events, makes the watch dirty for good; the caller
// then walks the base again and arms a new one.
//
// What a watch does not see, and why the caller also bounds its trust in
// time (overlay.Backend.CheckBase): a write through a shared writable
// mmap raises no fanotify event (it moves the file's mtime at the fault,
// which a stat walk would see).
package basewatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/fsat"
)

// changeMask is every event that changes the tree under a marked
// directory: its children's content (MODIFY; CLOSE_WRITE for writers
// that write nothing), metadata (ATTRIB: mode, owner, times, xattrs, link
// count), names (CREATE, DELETE, MOVED_FROM, MOVED_TO) and the directory
// itself (DELETE_SELF, MOVE_SELF), for files and directories alike.
const changeMask = unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CLOSE_WRITE |
	unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
	unix.FAN_DELETE_SELF | unix.FAN_MOVE_SELF | unix.FAN_ONDIR | unix.FAN_EVENT_ON_CHILD

// Watch is one armed base directory. Its methods are safe for concurrent
// use.
type Watch struct {
	armed time.Time
	dirs  int

	mu    sync.Mutex
	fd    int // -1 once closed
	dirty bool
	buf   []byte
}

// Arm marks every directory below root (root included). Events from the
// first mark on count, so a change made while Arm walks is seen; the
// caller checks the base after Arm returns, and may trust it until Dirty.
func Arm(ctx context.Context, root string) (*Watch, error) {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_LARGEFILE)
	if err != nil {
		return nil, fmt.Errorf("base %s: fanotify_init: %w", root, err)
	}
	w := &Watch{fd: fd, armed: time.Now(), buf: make([]byte, 4096)}
	dfd, err := fsat.OpenDir(root)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("base %s: %w", root, err)
	}
	err = w.mark(ctx, dfd, 0, make([]byte, fsat.DirBufSize))
	unix.Close(dfd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("base %s: watch: %w", root, err)
	}
	return w, nil
}

// mark marks directory dfd and, below it, each subdirectory.
func (w *Watch) mark(ctx context.Context, dfd, depth int, buf []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if depth > delta.MaxDepth {
		return fmt.Errorf("directories nested more than %d deep", delta.MaxDepth)
	}
	if err := unix.FanotifyMark(w.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_INODE, changeMask, dfd, ""); err != nil {
		// ENOSPC: fs.fanotify.max_user_marks is reached.
		return fmt.Errorf("fanotify_mark: %w", err)
	}
	w.dirs++
	var subdirs []string
	err := fsat.EachDirName(dfd, buf, func(name []byte) error {
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			subdirs = append(subdirs, string(name))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, name := range subdirs {
		sfd, err := fsat.Open(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		err = w.mark(ctx, sfd, depth+1, buf)
		unix.Close(sfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// Dirs is how many directories the watch marks.
func (w *Watch) Dirs() int { return w.dirs }

// Armed is when the watch was armed.
func (w *Watch) Armed() time.Time { return w.armed }

// Dirty reports whether anything below the base may have changed since
// Arm: an event was queued (an overflow is one too), the group can no
// longer be read, or the watch is closed. Once dirty, always dirty.
func (w *Watch) Dirty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty || w.fd < 0 {
		return true
	}
	// Any event, or any error but "nothing queued": the record is gone.
	if _, err := unix.Read(w.fd, w.buf); !errors.Is(err, unix.EAGAIN) {
		w.dirty = true
	}
	return w.dirty
}

// Close removes the marks (closing the group).
func (w *Watch) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return nil
	}
	fd := w.fd
	w.fd = -1
	return unix.Close(fd)
}
