package harness

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/turnsnap/turnsnap/proc"
)

// fullCkpt is the full-checkpoint-per-turn baseline: after every turn a
// tar+zstd of the whole root and, when the trace's processes run, a CRIU
// dump of the container (processes paused across both, one instant). Each
// turn's checkpoint counts as stored; only the newest stays on disk.
type fullCkpt struct {
	h       *Harness
	sandbox string
	dir     string
	last    string // the newest checkpoint's directory
}

// checkpoint writes turn's full checkpoint and returns its bytes and how
// long it kept the processes paused (0 without processes: the root is
// archived while the agent waits for its model, nothing runs in it).
func (f *fullCkpt) checkpoint(ctx context.Context, turn int, procs bool) (n int64, pause time.Duration, err error) {
	root, err := f.h.c.SandboxPath(ctx, f.sandbox)
	if err != nil {
		return 0, 0, err
	}
	dir := filepath.Join(f.dir, fmt.Sprintf("turn-%04d", turn))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, 0, err
	}
	id := f.h.containerID(f.sandbox)
	var rt *proc.Runtime
	if procs {
		if rt, err = f.h.runtime(ctx); err != nil {
			return 0, 0, err
		}
		if err := rt.Pause(ctx, id); err != nil {
			return 0, 0, err
		}
		paused := time.Now()
		defer func() {
			rerr := rt.Resume(context.WithoutCancel(ctx), id)
			pause = time.Since(paused)
			if err == nil && rerr != nil {
				err = rerr
			}
		}()
	}
	if n, err = tarZstd(root.Root, filepath.Join(dir, "root.tar.zst")); err != nil {
		return 0, 0, err
	}
	if procs {
		meta, err := rt.Checkpoint(ctx, id, filepath.Join(dir, "criu"), proc.DumpOptions{})
		if err != nil {
			return 0, 0, err
		}
		n += meta.Bytes
	}
	if f.last != "" {
		os.RemoveAll(f.last)
	}
	f.last = dir
	return n, 0, nil
}

// restore empties the root, unpacks the newest archive into it and, if it
// has one, restores the CRIU image as the sandbox's container.
func (f *fullCkpt) restore(ctx context.Context) error {
	if f.last == "" {
		return fmt.Errorf("sandbox %s: no full checkpoint to restore", f.sandbox)
	}
	rt, err := f.h.runtime(ctx)
	if err != nil {
		return err
	}
	id := f.h.containerID(f.sandbox)
	if err := rt.Delete(ctx, id); err != nil {
		return err
	}
	root, err := f.h.c.SandboxPath(ctx, f.sandbox)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(root.Root)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(root.Root, e.Name())); err != nil {
			return err
		}
	}
	if err := untarZstd(filepath.Join(f.last, "root.tar.zst"), root.Root); err != nil {
		return err
	}
	img := filepath.Join(f.last, "criu")
	if _, err := os.Stat(img); err != nil {
		return nil
	}
	_, err = rt.Restore(ctx, id, root.Root, img, proc.RestoreOptions{})
	return err
}

// tarZstd archives root into file and returns the archive's size.
func tarZstd(root, file string) (int64, error) {
	out, err := os.Create(file)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return 0, err
	}
	tw := tar.NewWriter(zw)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		hdr.Format = tar.FormatPAX // nanosecond mtimes
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("archive of %s: %w", root, err)
	}
	st, err := out.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), out.Sync()
}

// untarZstd unpacks an archive tarZstd wrote (names checked to stay
// inside dst; the archive is our own, but a bad one must not escape).
func untarZstd(file, dst string) error {
	in, err := os.Open(file)
	if err != nil {
		return err
	}
	defer in.Close()
	zr, err := zstd.NewReader(in, zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		return err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.FromSlash(hdr.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			return fmt.Errorf("archive %s: entry %q leaves the root", file, hdr.Name)
		}
		p := filepath.Join(dst, name)
		mode := fs.FileMode(hdr.Mode & 0o777)
		for bit, m := range map[int64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
			if hdr.Mode&bit != 0 {
				mode |= m
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeFifo:
			if err := syscall.Mkfifo(p, uint32(mode.Perm())); err != nil {
				return err
			}
		default:
			continue
		}
		os.Lchown(p, hdr.Uid, hdr.Gid)
		if hdr.Typeflag != tar.TypeSymlink {
			os.Chmod(p, mode)
		}
		if hdr.Typeflag == tar.TypeReg {
			os.Chtimes(p, hdr.AccessTime, hdr.ModTime)
		}
	}
}
