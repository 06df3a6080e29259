// Package layers unpacks a bench base given as an OCI image layout or a
// tarball into a directory. Both come from whoever wrote the trace, so the
// reader treats them as hostile: every write goes through an os.Root (no
// path, symlink or hard link reaches outside the destination), every size
// it reads (JSON documents, entries, file bytes, layers) is bounded, and
// blobs are checked against their digests.
package layers

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Limits bound what one image may make the reader do.
type Limits struct {
	Entries   int   // tar entries over all layers
	Bytes     int64 // file content written over all layers
	FileBytes int64 // one file
	Layers    int
	JSONBytes int64 // index.json, a manifest, an index blob
}

// DefaultLimits fit a language-runtime image (a Debian rootfs with
// python3 is 11,500 entries and 276 MB) with room to spare.
var DefaultLimits = Limits{Entries: 500_000, Bytes: 8 << 30, FileBytes: 2 << 30, Layers: 128, JSONBytes: 4 << 20}

const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
	maxName        = 4096
)

// state is the budget left while unpacking one image.
type state struct {
	lim     Limits
	entries int
	bytes   int64
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalid)
}

// UnpackTar unpacks the tarball file (plain, gzip or zstd, told by its
// first bytes) into dst, which must exist. Names starting with .wh. are
// ordinary files here: a tarball is a whole tree, not a layer.
func UnpackTar(ctx context.Context, file, dst string, lim Limits) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	st := &state{lim: lim}
	if err := st.apply(ctx, f, root, false); err != nil {
		return fmt.Errorf("tarball %s: %w", file, err)
	}
	return nil
}

// ApplyLayer applies one layer (plain, gzip or zstd tar) on top of the
// tree in root: whiteouts remove what the layers below wrote.
func ApplyLayer(ctx context.Context, r io.Reader, root *os.Root, lim Limits) error {
	return (&state{lim: lim}).apply(ctx, r, root, true)
}

// decompress tells the compression from the stream's first bytes.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, invalid("gzip: %v", err)
		}
		z.Multistream(false)
		return z, func() { z.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// The decoder's window is bounded, so a frame cannot ask for
		// an absurd buffer.
		z, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20), zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, nil, invalid("zstd: %v", err)
		}
		return z, z.Close, nil
	}
	return br, func() {}, nil
}

func (st *state) apply(ctx context.Context, r io.Reader, root *os.Root, layer bool) error {
	dr, done, err := decompress(r)
	if err != nil {
		return err
	}
	defer done()
	tr := tar.NewReader(dr)
	// Paths this layer wrote: an opaque whiteout keeps them and clears
	// what the lower layers left in its directory.
	mine := map[string]bool{}
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirTimes []dirTime
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return invalid("tar: %v", err)
		}
		if st.entries++; st.entries > st.lim.Entries {
			return invalid("more than %d entries", st.lim.Entries)
		}
		// Every entry's size is bounded before its bytes are read, even
		// one that is skipped (tar.Next reads past it).
		if hdr.Size < 0 || hdr.Size > st.lim.FileBytes {
			return invalid("entry %q: %d bytes, over %d", hdr.Name, hdr.Size, st.lim.FileBytes)
		}
		if st.bytes += hdr.Size; st.bytes > st.lim.Bytes {
			return invalid("entry %q: the image is over %d bytes", hdr.Name, st.lim.Bytes)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			if hdr.Typeflag == tar.TypeDir {
				continue
			}
			return invalid("entry %q: the root must be a directory", hdr.Name)
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" {
			dir = "."
		}
		if layer && strings.HasPrefix(base, whiteoutPrefix) {
			if base == opaqueWhiteout {
				if err := clearDir(root, dir, mine); err != nil {
					return fmt.Errorf("opaque whiteout in %s: %w", dir, err)
				}
				continue
			}
			victim := path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))
			if victim == dir || strings.HasPrefix(path.Base(victim), ".wh.") || path.Base(victim) == ".." || path.Base(victim) == "." {
				return invalid("whiteout %q names nothing", hdr.Name)
			}
			if err := root.RemoveAll(victim); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("whiteout %s: %w", victim, err)
			}
			continue
		}
		if dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("entry %s: parent: %w", name, err)
			}
		}
		if hdr.Typeflag != tar.TypeDir {
			// A layer replaces what was there (never writes through a
			// symlink or into a hard link's other names).
			if err := root.RemoveAll(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("entry %s: %w", name, err)
			}
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		if hdr.Mode&0o4000 != 0 {
			mode |= fs.ModeSetuid
		}
		if hdr.Mode&0o2000 != 0 {
			mode |= fs.ModeSetgid
		}
		if hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		chmod := true
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
				if err := root.RemoveAll(name); err != nil {
					return fmt.Errorf("entry %s: %w", name, err)
				}
			}
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("entry %s: %w", name, err)
			}
			dirTimes = append(dirTimes, dirTime{name, hdr.ModTime})
		case tar.TypeReg: // tar.Reader reports the old '\x00' type as TypeReg
			if err := st.writeFile(root, name, tr, hdr.Size); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if len(hdr.Linkname) > maxName || strings.ContainsRune(hdr.Linkname, 0) {
				return invalid("symlink %s: target over %d bytes", name, maxName)
			}
			// The link is stored as written; the os.Root every later
			// write goes through refuses to follow it outside dst.
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("entry %s: %w", name, err)
			}
			chmod = false
		case tar.TypeLink:
			target, err := cleanName(hdr.Linkname)
			if err != nil || target == "." {
				return invalid("hard link %s: target %q", name, hdr.Linkname)
			}
			if fi, err := root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
				return invalid("hard link %s: target %s is not a regular file of the tree", name, target)
			}
			if err := root.Link(target, name); err != nil {
				return fmt.Errorf("entry %s: %w", name, err)
			}
			mine[name] = true
			continue // the target's metadata is the link's
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			// Device nodes and fifos are not part of a sandbox's base
			// (the runtime makes /dev); they are skipped.
			continue
		case tar.TypeXGlobalHeader:
			continue
		default:
			return invalid("entry %s: unsupported type %q", name, hdr.Typeflag)
		}
		mine[name] = true
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("entry %s: owner: %w", name, err)
		}
		if chmod {
			if err := root.Chmod(name, mode); err != nil {
				return fmt.Errorf("entry %s: mode: %w", name, err)
			}
			if hdr.Typeflag != tar.TypeDir {
				root.Chtimes(name, hdr.ModTime, hdr.ModTime)
			}
		}
	}
	// Directories' times last: writing their entries moved them.
	for i := len(dirTimes) - 1; i >= 0; i-- {
		d := dirTimes[i]
		if fi, err := root.Lstat(d.name); err == nil && fi.IsDir() {
			root.Chtimes(d.name, d.t, d.t)
		}
	}
	// Drain the stream's padding (and a digest check's remaining bytes).
	_, err = io.Copy(io.Discard, io.LimitReader(dr, 1<<20))
	return err
}

// writeFile writes a file whose size apply has bounded.
func (st *state) writeFile(root *os.Root, name string, r io.Reader, size int64) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("entry %s: %w", name, err)
	}
	if _, err := io.CopyN(f, r, size); err != nil {
		f.Close()
		return invalid("file %s: %v", name, err)
	}
	return f.Close()
}

// cleanName turns a tar name into a clean relative path, refusing one
// that climbs out (../) rather than silently rebasing it.
func cleanName(n string) (string, error) {
	if len(n) > maxName || strings.ContainsRune(n, 0) {
		return "", invalid("entry name over %d bytes or with a NUL byte", maxName)
	}
	n = strings.TrimLeft(n, "/")
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", invalid("entry %q climbs out of the root", n)
		}
	}
	c := path.Clean(n)
	if c == "" {
		c = "."
	}
	return c, nil
}

// clearDir removes what dir holds, but for the paths this layer wrote.
func clearDir(root *os.Root, dir string, keep map[string]bool) error {
	fi, err := root.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return nil
	}
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if keep[p] {
			continue
		}
		kept := false
		for k := range keep {
			if strings.HasPrefix(k, p+"/") {
				kept = true
				break
			}
		}
		if kept {
			if err := clearDir(root, p, keep); err != nil {
				return err
			}
			continue
		}
		if err := root.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}
