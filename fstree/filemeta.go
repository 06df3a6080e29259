package fstree

import "github.com/turnsnap/turnsnap/delta"

// SetFileMeta gives the open file fd entry e's ownership, mode, xattrs and
// mtime, exactly as a restore does (xattrs e does not list are removed,
// except overlay's trusted.overlay.*). Lazy restore calls it after filling
// a placeholder: writing a file drops its file capabilities and moves its
// mtime, and the fill's marker xattr must go.
func SetFileMeta(fd int, e *delta.Entry) error {
	return setMeta(metaTarget{fd: fd}, e)
}
