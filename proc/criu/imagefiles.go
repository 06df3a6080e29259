package criu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	remap "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"google.golang.org/protobuf/proto"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// ImageFile is a regular file of the container's root that an image's
// processes reference (open, mapped, or as executable), as CRIU will look
// for it on restore: the path must name a regular file of Size bytes, or
// the restore fails ("File data/log has bad size 49 (expect 6)").
type ImageFile struct {
	Path string // inside the container, "/data/log"
	Size int64
}

// Bounds on what ImageFiles reads from an image (data from storage).
const (
	maxImageMeta  = 64 << 20 // files.img, remap-fpath.img
	maxImageEntry = 1 << 20  // one protobuf entry
)

// ImageFiles lists the files of the container's root that the image in
// imageDir expects, so that a restore can be refused before anything is
// stopped when the files it would restore onto do not fit. Files whose
// contents the image holds itself (ghost files of deleted files, link
// remaps) and files of the container's own kernel and tmpfs mounts (/dev,
// /proc, /sys) are left out.
func ImageFiles(imageDir string) ([]ImageFile, error) {
	remapped := map[uint32]bool{}
	err := ReadImage(filepath.Join(imageDir, "remap-fpath.img"), func() proto.Message { return &remap.RemapFilePathEntry{} },
		func(m proto.Message) {
			remapped[m.(*remap.RemapFilePathEntry).GetOrigId()] = true
		})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var out []ImageFile
	err = ReadImage(filepath.Join(imageDir, "files.img"), func() proto.Message { return &fdinfo.FileEntry{} },
		func(m proto.Message) {
			reg := m.(*fdinfo.FileEntry).GetReg()
			if reg == nil || reg.Size == nil || remapped[reg.GetId()] {
				return
			}
			name := "/" + strings.TrimPrefix(reg.GetName(), "/")
			if strings.HasSuffix(name, " (deleted)") || PseudoFS(name) || name == "/dev" || strings.HasPrefix(name, "/dev/") {
				return
			}
			out = append(out, ImageFile{Path: name, Size: int64(reg.GetSize())})
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PseudoFS are paths whose files are the kernel's, not the sandbox's: CRIU
// handles them on its own, and their inode numbers and times are not
// stable across reads.
func PseudoFS(path string) bool {
	return strings.HasPrefix(path, "/proc/") || path == "/proc" ||
		strings.HasPrefix(path, "/sys/") || path == "/sys"
}

// ReadImage decodes every entry of one CRIU image file (magic, then
// length-prefixed protobuf messages), bounding every size it reads.
func ReadImage(path string, newMsg func() proto.Message, each func(proto.Message)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := crit.ReadMagic(f); err != nil {
		return fmt.Errorf("image file %s: %v: %w", path, err, errdefs.ErrCorrupt)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxImageMeta+1))
	if err != nil {
		return fmt.Errorf("image file %s: %w", path, err)
	}
	if len(b) > maxImageMeta {
		return fmt.Errorf("image file %s: larger than %d bytes: %w", path, maxImageMeta, errdefs.ErrCorrupt)
	}
	r := bytes.NewReader(b)
	for r.Len() > 0 {
		var n uint32
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			return fmt.Errorf("image file %s: truncated entry size: %w", path, errdefs.ErrCorrupt)
		}
		if n > maxImageEntry || int(n) > r.Len() {
			return fmt.Errorf("image file %s: entry of %d bytes with %d left: %w", path, n, r.Len(), errdefs.ErrCorrupt)
		}
		buf := make([]byte, n)
		r.Read(buf)
		m := newMsg()
		if err := proto.Unmarshal(buf, m); err != nil {
			return fmt.Errorf("image file %s: %v: %w", path, err, errdefs.ErrCorrupt)
		}
		each(m)
	}
	return nil
}
