package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// markMask is what a placeholder's inode mark asks for: the open (every
// read, mmap and exec starts with one; an mmap through overlay reports
// nothing else) and pre-access (truncate(2) by path opens nothing).
const markMask = unix.FAN_OPEN_PERM | unix.FAN_PRE_ACCESS

// metaLen is the size of one event's fixed part.
const metaLen = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))

// Config describes one layer to fill.
type Config struct {
	// Sandbox names the sandbox in errors and logs.
	Sandbox string
	// Dir is the root's directory: it holds the state file.
	Dir string
	// Upper is the writable layer, where the placeholders live: a
	// filesystem that takes pre-content marks (ext4, btrfs, xfs; not tmpfs).
	Upper string
	// Tree is the layer's tree, in overlay upper form.
	Tree delta.ID
	// Loader reads trees and chunks (through the bucket); it verifies what
	// it returns against the blob's ID.
	Loader delta.BlobLoader
	// IDs is the home's content ID scheme.
	IDs delta.IDs
	// AllowDevices: as fstree.ApplyOptions.AllowDevices.
	AllowDevices bool
	// Writers make the placeholders beside the walk (0:
	// fstree.ParallelWorkers; 1: none, the walk alone).
	Writers int
	// Log receives one line per failed fill; nil means slog.Default().
	Log *slog.Logger
	// Keeper starts a process that holds the group (keeper.go), so an
	// access while no daemon runs waits rather than reading holes, and
	// Recover takes the group back from it. A daemon sets it; a Close
	// stops the keeper, a crash leaves it.
	Keeper bool
}

// Stats counts a filler's work.
type Stats struct {
	Pending     int64 // files not filled yet
	Filled      int64 // files filled
	Bytes       int64 // data bytes written by fills
	OnDemand    int64 // fills started by an access of the sandbox (the rest by fetch-ahead)
	FailedFills int64
}

// fileKey is an inode of the upper's filesystem.
type fileKey struct{ dev, ino uint64 }

// pendingFile is one placeholder not filled yet.
type pendingFile struct {
	rel    string
	entry  delta.Entry
	handle unix.FileHandle
	// busy is closed when the fill that is running ends; nil when none runs.
	busy chan struct{}
	err  error // the last fill's error, for those who waited on it
}

// Filler answers the pre-content events of one layer's placeholders: the
// first open (or read, or truncate) of one waits while its chunks are read,
// written and synced, and its marker and inode mark removed; then every
// waiter is let through. One fill per file at a time: concurrent openers
// wait for the same fill, and a filled file is never fetched again (its
// mark is gone, so the kernel no longer asks).
type Filler struct {
	cfg Config
	log *slog.Logger
	// events is the fanotify group, read through Go's poller (nonblocking,
	// so Close stops the reader); gfd is a duplicate of it for marks and
	// answers (os.File.Fd would make events blocking again).
	events *os.File
	gfd    int
	upper  *os.File // a descriptor on the upper's filesystem, for open_by_handle_at
	keeper *keeper  // nil without Config.Keeper
	// ctx bounds the fills; Close cancels it and waits for answers.
	ctx     context.Context
	cancel  context.CancelFunc
	answers sync.WaitGroup

	mu      sync.Mutex
	pending map[fileKey]*pendingFile
	ready   bool          // every placeholder made and marked
	done    chan struct{} // closed once ready and nothing is pending
	lastErr error

	filled, bytes, onDemand, failed atomic.Int64
	readerDone                      chan struct{}
	readerStarted                   bool // set before the reader starts, by markReady
	closeOnce                       sync.Once
}

// Restore makes cfg.Tree in cfg.Upper as placeholders and returns the
// filler that fills them on first access. The state file is written first
// and marked ready last, so a crash between leaves a root that Recover
// refuses (the layer is made again).
func Restore(ctx context.Context, cfg Config) (*Filler, error) {
	f, err := newFiller(cfg, -1)
	if err != nil {
		return nil, err
	}
	if cfg.Keeper {
		if f.keeper, err = startKeeper(f.gfd); err != nil {
			f.Close()
			return nil, fmt.Errorf("sandbox %s: lazy restore: %w", cfg.Sandbox, err)
		}
	}
	if err := writeState(cfg.Dir, cfg.Tree, false, f.keeperPID()); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox %s: lazy restore state: %w", cfg.Sandbox, err)
	}
	if _, err := placeholders(ctx, f); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox %s: lazy restore of %s: %w", cfg.Sandbox, cfg.Tree.Short(), err)
	}
	if err := f.markReady(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// newFiller makes a filler on a new group, or on fd, a group taken over
// from a keeper.
func newFiller(cfg Config, fd int) (*Filler, error) {
	if fd < 0 {
		var err error
		fd, err = unix.FanotifyInit(unix.FAN_CLASS_PRE_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_UNLIMITED_QUEUE|unix.FAN_UNLIMITED_MARKS,
			unix.O_RDWR|unix.O_LARGEFILE|unix.O_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: lazy restore: fanotify pre-content group: %w", cfg.Sandbox, err)
		}
	} else if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %s: lazy restore: %w", cfg.Sandbox, err)
	}
	gfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %s: lazy restore: %w", cfg.Sandbox, err)
	}
	up, err := os.Open(cfg.Upper)
	if err != nil {
		unix.Close(fd)
		unix.Close(gfd)
		return nil, fmt.Errorf("sandbox %s: lazy restore: %w", cfg.Sandbox, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Filler{cfg: cfg, log: cfg.Log, events: os.NewFile(uintptr(fd), "fanotify"), gfd: gfd, upper: up, ctx: ctx, cancel: cancel,
		pending: map[fileKey]*pendingFile{}, done: make(chan struct{}), readerDone: make(chan struct{})}
	if f.log == nil {
		f.log = slog.Default()
	}
	return f, nil
}

// add marks the placeholder open as fd and remembers its entry.
func (f *Filler) add(rel string, e *delta.Entry, fd int) error { return f.addAt(rel, e, fd, "") }

// addAt is add of the placeholder at path name (never followed), or of fd
// when name is empty. Recover names files by path: opening one would raise
// an event on a group taken over with its marks.
func (f *Filler) addAt(rel string, e *delta.Entry, fd int, name string) error {
	statFlags, handleFlags, markFlags := unix.AT_SYMLINK_NOFOLLOW, 0, uint(unix.FAN_MARK_ADD|unix.FAN_MARK_INODE)
	if name == "" {
		statFlags |= unix.AT_EMPTY_PATH
		handleFlags = unix.AT_EMPTY_PATH
	} else {
		markFlags |= unix.FAN_MARK_DONT_FOLLOW
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, statFlags); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("placeholder /%s is not a regular file", rel)
	}
	h, _, err := unix.NameToHandleAt(fd, name, handleFlags)
	if err != nil {
		return fmt.Errorf("file handle: %w", err)
	}
	if err := unix.FanotifyMark(f.gfd, markFlags, markMask, fd, name); err != nil {
		return fmt.Errorf("pre-content mark: %w", err)
	}
	f.mu.Lock()
	f.pending[fileKey{uint64(st.Dev), st.Ino}] = &pendingFile{rel: rel, entry: *e, handle: h}
	f.mu.Unlock()
	return nil
}

// markReady records that every placeholder is made and marked; the layer
// is complete at once if it holds no file.
func (f *Filler) markReady() error {
	if err := writeState(f.cfg.Dir, f.cfg.Tree, true, f.keeperPID()); err != nil {
		return fmt.Errorf("sandbox %s: lazy restore state: %w", f.cfg.Sandbox, err)
	}
	f.mu.Lock()
	f.ready = true
	f.mu.Unlock()
	// Events are read only from here: on a group taken over from a keeper,
	// an access queued before every placeholder was known again would
	// otherwise be let through unfilled.
	f.readerStarted = true
	go f.read()
	return f.maybeDone()
}

// maybeDone completes the layer once nothing is pending: the filesystem is
// synced, then the state file removed.
func (f *Filler) maybeDone() error {
	f.mu.Lock()
	if !f.ready || len(f.pending) > 0 {
		f.mu.Unlock()
		return nil
	}
	select {
	case <-f.done:
		f.mu.Unlock()
		return nil
	default:
	}
	f.ready = false // one completer
	f.mu.Unlock()
	err := unix.Syncfs(int(f.upper.Fd()))
	if err == nil {
		err = clearState(f.cfg.Dir)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.ready = true
		f.lastErr = fmt.Errorf("sandbox %s: lazy restore: complete: %w", f.cfg.Sandbox, err)
		return f.lastErr
	}
	close(f.done)
	return nil
}

// read answers the group's events until Close.
func (f *Filler) read() {
	defer close(f.readerDone)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.events.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) {
				f.log.Error("lazy restore: reading fanotify events", "sandbox", f.cfg.Sandbox, "err", err)
			}
			return
		}
		for off := 0; off+metaLen <= n; {
			md := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
			if int(md.Event_len) < metaLen || off+int(md.Event_len) > n {
				f.log.Error("lazy restore: malformed fanotify event", "sandbox", f.cfg.Sandbox)
				break
			}
			off += int(md.Event_len)
			if md.Vers != unix.FANOTIFY_METADATA_VERSION || md.Fd < 0 {
				continue
			}
			// Each event in its own goroutine: a fill may take seconds and
			// other files' openers must not queue behind it. Their number
			// is bounded by the threads blocked in the kernel on them.
			f.answers.Add(1)
			go f.answer(int(md.Fd))
		}
	}
}

// answer fills the file of one event (or waits for its fill) and lets the
// access through, or refuses it with EIO when the fill failed.
func (f *Filler) answer(fd int) {
	defer f.answers.Done()
	err := f.fillFD(f.ctx, fd, true)
	resp := unix.FanotifyResponse{Fd: int32(fd), Response: unix.FAN_ALLOW}
	if err != nil {
		resp.Response = unix.FAN_DENY | uint32(unix.EIO)<<unix.FAN_ERRNO_SHIFT
	}
	b := (*[unsafe.Sizeof(resp)]byte)(unsafe.Pointer(&resp))[:]
	if _, werr := unix.Write(f.gfd, b); werr != nil {
		f.log.Error("lazy restore: answering fanotify event", "sandbox", f.cfg.Sandbox, "err", werr)
	}
	unix.Close(fd)
}

// fillFD fills the placeholder open as fd (a descriptor the group opened
// read-write, which raises no events) unless it is filled or being filled,
// in which case it waits for that fill.
func (f *Filler) fillFD(ctx context.Context, fd int, onDemand bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	k := fileKey{uint64(st.Dev), st.Ino}
	for {
		f.mu.Lock()
		p, ok := f.pending[k]
		if !ok {
			f.mu.Unlock()
			return nil // filled meanwhile (its mark was removed after the event was queued)
		}
		if p.busy != nil {
			busy := p.busy
			f.mu.Unlock()
			select {
			case <-busy:
			case <-ctx.Done():
				return ctx.Err()
			}
			f.mu.Lock()
			err := p.err
			_, still := f.pending[k]
			f.mu.Unlock()
			if !still {
				return nil
			}
			if err != nil {
				return err // the fill we waited for failed: its error, not a retry storm
			}
			continue
		}
		p.busy = make(chan struct{})
		f.mu.Unlock()
		err := f.fill(ctx, fd, p)
		f.mu.Lock()
		p.err = err
		close(p.busy)
		p.busy = nil
		if err == nil {
			delete(f.pending, k)
		}
		f.mu.Unlock()
		if err != nil {
			f.failed.Add(1)
			f.mu.Lock()
			f.lastErr = err
			f.mu.Unlock()
			f.log.Error("lazy restore: fill failed", "sandbox", f.cfg.Sandbox, "path", "/"+p.rel, "err", err)
			return err
		}
		f.filled.Add(1)
		if onDemand {
			f.onDemand.Add(1)
		}
		return f.maybeDone()
	}
}

// fill writes p's chunks into fd, syncs them, then gives the file its
// entry's metadata (which removes the marker: a crash before that leaves a
// marked file, filled again at recovery), and removes the inode mark.
func (f *Filler) fill(ctx context.Context, fd int, p *pendingFile) error {
	wrap := func(err error) error {
		return fmt.Errorf("sandbox %s: lazy restore of /%s (tree %s): %w", f.cfg.Sandbox, p.rel, f.cfg.Tree.Short(), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wrap(err)
	}
	// Nothing past the file's size now is written: a truncate(2) by path
	// through overlay raises no event, so the file may have been cut
	// before its first open, and a cut file keeps the stored head, as it
	// would have. The placeholder already has its size, holes only.
	n, err := fstree.WriteRuns(ctx, f.cfg.Loader, placeholderWriter(fd), &p.entry, uint64(st.Size))
	if err != nil {
		return wrap(err)
	}
	if err := unix.Fdatasync(fd); err != nil {
		return wrap(err)
	}
	if err := fstree.SetFileMeta(fd, &p.entry); err != nil {
		return wrap(err)
	}
	if uint64(st.Size) != p.entry.Size {
		// Cut by a truncate the kernel did not report: its mtime is the
		// sandbox's, not the stored one.
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
			return wrap(err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		return wrap(err)
	}
	if err := unix.FanotifyMark(f.gfd, unix.FAN_MARK_REMOVE|unix.FAN_MARK_INODE, markMask, fd, ""); err != nil && !errors.Is(err, unix.ENOENT) {
		// Harmless: the next access asks again and finds it filled.
		f.log.Warn("lazy restore: removing a filled file's mark", "sandbox", f.cfg.Sandbox, "path", "/"+p.rel, "err", err)
	}
	f.bytes.Add(int64(n))
	return nil
}

// Detach stops answering events as Close does, but leaves the keeper (if
// any) holding the group: accesses then wait for the next process to
// Recover the layer, rather than read holes. A daemon that shuts down with
// a restore unfinished detaches.
func (f *Filler) Detach() error {
	if f.keeper != nil {
		unix.Close(f.keeper.pidfd)
		f.keeper = nil
	}
	return f.Close()
}

func (f *Filler) keeperPID() int {
	if f.keeper == nil {
		return 0
	}
	return f.keeper.pid
}

// Stats reports the filler's progress.
func (f *Filler) Stats() Stats {
	f.mu.Lock()
	pending := int64(len(f.pending))
	f.mu.Unlock()
	return Stats{Pending: pending, Filled: f.filled.Load(), Bytes: f.bytes.Load(), OnDemand: f.onDemand.Load(), FailedFills: f.failed.Load()}
}

// Done is closed once the layer is whole: every file filled and synced,
// the state file removed.
func (f *Filler) Done() <-chan struct{} { return f.done }

// Wait waits until the layer is whole. Checkpoints, verifies and branches
// of the sandbox call it first: a placeholder must never be recorded.
func (f *Filler) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandbox %s: waiting for the lazy restore to complete: %w", f.cfg.Sandbox, ctx.Err())
	}
}

// Err returns the last fill error, if any.
func (f *Filler) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

// Close stops answering events. Placeholders not filled stay marked on
// disk (the state file stays too), so Recover finishes them; but until a
// new filler marks them again, an access reads their holes: call Close
// only once the layer is whole or the sandbox is stopped.
func (f *Filler) Close() error {
	var err error
	f.closeOnce.Do(func() {
		if f.keeper != nil {
			f.keeper.stop()
		}
		f.cancel()
		err = f.events.Close()
		if f.readerStarted {
			<-f.readerDone
		}
		f.answers.Wait()
		if cerr := unix.Close(f.gfd); err == nil {
			err = cerr
		}
		f.upper.Close()
	})
	return err
}
