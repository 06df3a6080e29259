package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// upperScan holds what one scan of an upper directory looks at besides
// the upper itself: the lower (for copy-up residue) and the mount (for
// renamed directories). Both are opened once and walked by descriptor.
type upperScan struct {
	r       *Root
	lowerFD int
	mountFD int // -1 until a redirect needs it
	xbuf    []byte
}

func (r *Root) newUpperScan() (*upperScan, error) {
	fd, err := fsat.OpenDir(r.lower)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: lower dir: %w", r.dir, err)
	}
	return &upperScan{r: r, lowerFD: fd, mountFD: -1, xbuf: make([]byte, fsat.XattrBufSize)}, nil
}

func (u *upperScan) close() {
	unix.Close(u.lowerFD)
	if u.mountFD >= 0 {
		unix.Close(u.mountFD)
	}
}

// redirect lists a renamed base directory through the mount. Its upper
// directory holds only what changed below it (the rest is still at the
// lower path named by trusted.overlay.redirect), so the layer records it
// as an opaque directory with its full merged contents: the same form a
// btrfs root records for a moved directory, and one every backend restores
// without knowing about redirects (docs/FORMAT.md, "Renamed directories").
func (u *upperScan) redirect(dirFD int, name, rel string, e *delta.Entry) (int, error) {
	_, err := unix.Lgetxattr(fsat.ProcPath(dirFD, name), RedirectXattr, u.xbuf)
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("read redirect: %w", err)
	}
	if u.mountFD < 0 {
		mounted, err := mountinfo.Mounted(u.r.Path())
		if err != nil {
			return -1, err
		}
		if !mounted {
			return -1, fmt.Errorf("renamed directory %s can only be read through the mounted root: %w", rel, errdefs.ErrPrecondition)
		}
		if u.mountFD, err = fsat.OpenDir(u.r.Path()); err != nil {
			return -1, err
		}
	}
	fd, err := fsat.Open(u.mountFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, fmt.Errorf("renamed directory %s in the mount: %w", rel, err)
	}
	e.Opaque = true
	return fd, nil
}

// linkID is a multiply-linked upper file's identity in the mount.
func (u *upperScan) linkID(dirFD int, name, rel string, _ *unix.Stat_t) ([2]uint64, error) {
	var st unix.Stat_t
	if err := fsat.Lstat(u.mountFD, rel, &st); err != nil {
		return [2]uint64{}, fmt.Errorf("in the mount: %w", err)
	}
	return [2]uint64{st.Dev, st.Ino}, nil
}

// residue reports an upper directory that is only a copy-up of the lower
// directory of the same path with identical metadata: what a temp file
// created and deleted under a base directory leaves behind.
func (u *upperScan) residue(rel string, e *delta.Entry) bool {
	if e.Opaque {
		return false
	}
	fd, err := fsat.Open(u.lowerFD, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false
	}
	if st.Mode&07777 != e.Mode || st.Uid != e.UID || st.Gid != e.GID {
		return false
	}
	lx, err := fsat.XattrsFD(fd, u.xbuf, isOverlayXattr)
	if err != nil {
		return false
	}
	return slices.EqualFunc(lx, e.Xattrs, func(a, b delta.Xattr) bool {
		return a.Name == b.Name && bytes.Equal(a.Value, b.Value)
	})
}

func isOverlayXattr(name string) bool { return strings.HasPrefix(name, overlayXattrPrefix) }
