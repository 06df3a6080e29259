// Package diffview renders a diff of two sandbox states for people and
// scripts: each changed path with its sizes, the metadata that changed and,
// on request, a unified patch of text files.
package diffview

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree/pathrestore"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"golang.org/x/sys/unix"
)

// Options configures Describe (and the engine's DiffWith).
type Options struct {
	// Patch attaches a unified patch to each changed text file (a file is
	// text when both sides are valid UTF-8 without NUL bytes and at most
	// MaxPatchBytes); other files are marked Binary and their sizes say
	// what changed.
	Patch bool
	// MaxPatchBytes bounds each side of a patch (0: DefaultMaxPatchBytes).
	MaxPatchBytes int64
}

// DefaultMaxPatchBytes is the largest file side Describe turns into a patch.
const DefaultMaxPatchBytes = 1 << 20

// PathChange is one changed path of a diff, described for people and
// scripts.
type PathChange struct {
	Change string `json:"change"` // added, modified, deleted
	Path   string `json:"path"`   // "/src/main.go"
	// PathB64 is Path's raw bytes, base64 (standard, padded), when the
	// name is not valid UTF-8; Path then has U+FFFD where the bad bytes were.
	PathB64 string `json:"path_b64,omitempty"`
	Type    string `json:"type"` // the newer entry's type (the older one's for a deletion)
	// OldSize and NewSize are regular files' sizes on each side (absent
	// where the path is not a file on that side).
	OldSize *uint64 `json:"old_size,omitempty"`
	NewSize *uint64 `json:"new_size,omitempty"`
	// Meta lists what changed of a modified entry: type, mode, owner,
	// mtime, xattr (one per attribute), target, rdev, content.
	Meta []MetaChange `json:"meta,omitempty"`
	// Patch is the unified diff of a text file (Options.Patch), with
	// a/PATH and b/PATH labels (/dev/null for a missing side).
	Patch string `json:"patch,omitempty"`
	// Binary says a patch was asked for but the content is not text (or
	// is too large); the sizes say what changed.
	Binary bool `json:"binary,omitempty"`
}

// MetaChange is one metadata field that differs between the two sides.
type MetaChange struct {
	Field string `json:"field"`
	Name  string `json:"name,omitempty"` // the xattr's name
	Old   string `json:"old,omitempty"`
	New   string `json:"new,omitempty"`
	// OldB64 and NewB64 carry a symlink target that is not valid UTF-8.
	OldB64 string `json:"old_b64,omitempty"`
	NewB64 string `json:"new_b64,omitempty"`
}

// Describe turns changes, the diff of states from and to, into
// PathChanges, reading file contents for patches through loader or, when
// live is not "", the newer side's from live, the mounted root it was
// scanned from.
func Describe(ctx context.Context, loader delta.BlobLoader, from, to delta.Layers, live string, changes []delta.Change, o Options) ([]PathChange, error) {
	d := &describer{loader: loader, from: from, to: to, live: live, liveFD: -1, o: o}
	defer d.close()
	return d.describe(ctx, changes)
}

// describer turns delta.Changes into PathChanges, reading file contents
// for patches from the store or, for the live side, from the mounted root.
type describer struct {
	loader   delta.BlobLoader
	from, to delta.Layers
	live     string // the mounted root when the newer side is live
	liveFD   int
	o        Options
}

func (d *describer) close() {
	if d.liveFD >= 0 {
		unix.Close(d.liveFD)
	}
}

func (d *describer) describe(ctx context.Context, changes []delta.Change) ([]PathChange, error) {
	out := make([]PathChange, 0, len(changes))
	for _, c := range changes {
		p := "/" + c.Path
		pc := PathChange{Change: c.Kind.String(), Path: p, PathB64: b64(p), Type: c.Type.String()}
		old, err := d.primary(ctx, d.from, c.Old)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		nw, err := d.primary(ctx, d.to, c.New)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if old.Type == delta.TypeFile {
			pc.OldSize = &old.Size
		}
		if nw.Type == delta.TypeFile {
			pc.NewSize = &nw.Size
		}
		if c.Kind == delta.Modified {
			pc.Meta = metaChanges(&old, &nw)
		}
		if d.o.Patch && (old.Type == delta.TypeFile || nw.Type == delta.TypeFile) &&
			(c.Kind != delta.Modified || !delta.SameChunks(&old, &nw)) {
			if err := d.patch(ctx, c.Path, &old, &nw, &pc); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
		}
		out = append(out, pc)
	}
	return out, nil
}

// primary is e itself, or for a hardlink the file it names in state l.
func (d *describer) primary(ctx context.Context, l delta.Layers, e delta.Entry) (delta.Entry, error) {
	if e.Type != delta.TypeHardlink {
		return e, nil
	}
	p, ok, err := delta.Lookup(ctx, d.loader, l, e.Target)
	if err != nil || !ok {
		return e, err
	}
	return p, nil
}

func metaChanges(a, b *delta.Entry) []MetaChange {
	var m []MetaChange
	if a.Type != b.Type {
		m = append(m, MetaChange{Field: "type", Old: a.Type.String(), New: b.Type.String()})
	}
	if a.Mode != b.Mode {
		m = append(m, MetaChange{Field: "mode", Old: fmt.Sprintf("%04o", a.Mode), New: fmt.Sprintf("%04o", b.Mode)})
	}
	if a.UID != b.UID || a.GID != b.GID {
		m = append(m, MetaChange{Field: "owner", Old: fmt.Sprintf("%d:%d", a.UID, a.GID), New: fmt.Sprintf("%d:%d", b.UID, b.GID)})
	}
	if a.Type != delta.TypeDir && a.MtimeNs != b.MtimeNs {
		m = append(m, MetaChange{Field: "mtime", Old: nsTime(a.MtimeNs), New: nsTime(b.MtimeNs)})
	}
	m = append(m, xattrChanges(a.Xattrs, b.Xattrs)...)
	if a.Target != b.Target {
		m = append(m, MetaChange{Field: "target", Old: a.Target, New: b.Target, OldB64: b64(a.Target), NewB64: b64(b.Target)})
	}
	if a.Rdev != b.Rdev {
		m = append(m, MetaChange{Field: "rdev", Old: strconv.FormatUint(a.Rdev, 10), New: strconv.FormatUint(b.Rdev, 10)})
	}
	if a.Type == delta.TypeFile && b.Type == delta.TypeFile && !delta.SameChunks(a, b) {
		m = append(m, MetaChange{Field: "content", Old: strconv.FormatUint(a.Size, 10), New: strconv.FormatUint(b.Size, 10)})
	}
	return m
}

func nsTime(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// xattrChanges lists attributes added, removed or changed (both lists are
// sorted by name). Values are shown when they are short text.
func xattrChanges(a, b []delta.Xattr) []MetaChange {
	var m []MetaChange
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Name < b[j].Name):
			m = append(m, MetaChange{Field: "xattr", Name: a[i].Name, Old: xattrValue(a[i].Value)})
			i++
		case i == len(a) || b[j].Name < a[i].Name:
			m = append(m, MetaChange{Field: "xattr", Name: b[j].Name, New: xattrValue(b[j].Value)})
			j++
		default:
			if !bytes.Equal(a[i].Value, b[j].Value) {
				m = append(m, MetaChange{Field: "xattr", Name: a[i].Name, Old: xattrValue(a[i].Value), New: xattrValue(b[j].Value)})
			}
			i, j = i+1, j+1
		}
	}
	return m
}

func xattrValue(v []byte) string {
	if len(v) <= 64 && utf8.Valid(v) && bytes.IndexByte(v, 0) < 0 {
		return strconv.Quote(string(v))
	}
	return fmt.Sprintf("(%d bytes)", len(v))
}

// patch fills pc.Patch, or pc.Binary when either side is not text.
func (d *describer) patch(ctx context.Context, rel string, old, nw *delta.Entry, pc *PathChange) error {
	limit := d.o.MaxPatchBytes
	if limit <= 0 {
		limit = DefaultMaxPatchBytes
	}
	var a, b []byte
	if old.Type == delta.TypeFile {
		if old.Size > uint64(limit) {
			pc.Binary = true
			return nil
		}
		var buf bytes.Buffer
		if _, err := pathrestore.StreamContent(ctx, d.loader, &buf, old); err != nil {
			return err
		}
		a = buf.Bytes()
	}
	if nw.Type == delta.TypeFile {
		if nw.Size > uint64(limit) {
			pc.Binary = true
			return nil
		}
		var err error
		if b, err = d.newContent(ctx, rel, nw, limit); err != nil {
			return err
		}
	}
	if !isText(a) || !isText(b) {
		pc.Binary = true
		return nil
	}
	aName, bName := "a/"+rel, "b/"+rel
	if old.Type != delta.TypeFile {
		aName = "/dev/null"
	}
	if nw.Type != delta.TypeFile {
		bName = "/dev/null"
	}
	pc.Patch = udiff.Unified(aName, bName, string(a), string(b))
	return nil
}

// newContent reads the newer side of a file: from the store, or from the
// live root (read beneath it, no symlink followed) when that side is live.
func (d *describer) newContent(ctx context.Context, rel string, e *delta.Entry, limit int64) ([]byte, error) {
	if d.live == "" {
		var buf bytes.Buffer
		_, err := pathrestore.StreamContent(ctx, d.loader, &buf, e)
		return buf.Bytes(), err
	}
	if d.liveFD < 0 {
		fd, err := fsat.OpenDir(d.live)
		if err != nil {
			return nil, err
		}
		d.liveFD = fd
	}
	// O_PATH first, then reopen that very inode once it is known to be a
	// regular file: a device or fifo the sandbox swapped in since the scan
	// is never opened for reading.
	pfd, err := fsat.Open(d.liveFD, rel, unix.O_PATH)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil // gone since the scan
		}
		return nil, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, err // no longer a file: nothing to read
	}
	f, err := os.Open("/proc/self/fd/" + strconv.Itoa(pfd))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// b64 is the raw bytes of s, base64 (standard, padded), when s is not
// valid UTF-8: JSON strings cannot carry such names losslessly (encoding/json
// writes U+FFFD), so results carry both (README, "For scripts").
func b64(s string) string {
	if utf8.ValidString(s) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(s))
}

// isText is the patch rule: valid UTF-8 with no NUL byte.
func isText(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }
