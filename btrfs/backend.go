package btrfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"golang.org/x/sys/unix"
)

// Name is the backend's name in records and on the command line.
const Name = "btrfs"

// DefaultKeep is how many restore points a sandbox keeps. Each costs only
// the metadata blocks its turn changed, but btrfs slows down with many
// thousands of subvolumes; 32 covers the rollbacks agents actually make
// (the last few turns), and older checkpoints restore from the store.
const DefaultKeep = 32

// Options configures a Backend. Pool is the one setting kept with each
// sandbox: its JSON form, {"pool": DIR}, is the sandbox object's "config"
// (docs/FORMAT.md), the same bytes the earlier string map wrote.
type Options struct {
	// Pool is a directory on a mounted btrfs filesystem where the
	// backend keeps its subvolumes.
	Pool string `json:"pool"`
	// Keep is how many restore points each sandbox keeps; zero means
	// DefaultKeep.
	Keep   int          `json:"-"`
	Logger *slog.Logger `json:"-"`
	// IDs is the home's content ID scheme (zero: plain BLAKE3).
	IDs delta.IDs `json:"-"`
}

// Backend creates btrfs roots in one pool directory.
type Backend struct {
	pool string
	opts Options
}

// NewBackend returns a backend whose subvolumes live under opts.Pool.
func NewBackend(opts Options) (*Backend, error) {
	pool := opts.Pool
	if pool == "" {
		return nil, fmt.Errorf("btrfs backend needs a pool directory (--btrfs-pool): %w", errdefs.ErrInvalid)
	}
	abs, err := filepath.Abs(pool)
	if err != nil {
		return nil, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(abs, &fs); err != nil {
		return nil, fmt.Errorf("btrfs pool %s: %w: %w", abs, err, errdefs.ErrInvalid)
	}
	if fs.Type != unix.BTRFS_SUPER_MAGIC {
		return nil, fmt.Errorf("btrfs pool %s is not on a btrfs filesystem: %w", abs, errdefs.ErrInvalid)
	}
	if opts.Keep <= 0 {
		opts.Keep = DefaultKeep
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Backend{pool: abs, opts: opts}, nil
}

// Name is "btrfs".
func (b *Backend) Name() string { return Name }

// Pool returns the pool directory.
func (b *Backend) Pool() string { return b.pool }

func (b *Backend) basesDir() string     { return filepath.Join(b.pool, "bases") }
func (b *Backend) sandboxesDir() string { return filepath.Join(b.pool, "sandboxes") }

// baseInfo describes a base subvolume.
type baseInfo struct {
	Tree delta.ID `json:"tree"`
	// Gen is the highest transaction of any inode in the base: an inode of a
	// sandbox with a higher transid was changed in the sandbox.
	Gen uint64 `json:"gen"`
}

// PrepareBase returns the directory holding base tree as a read-only
// subvolume, importing it unless the pool has it already. The copy is
// verified before it is published by a rename, so a base that exists is
// complete.
func (b *Backend) PrepareBase(ctx context.Context, tree delta.ID, loader delta.BlobLoader) (string, error) {
	dst := filepath.Join(b.basesDir(), tree.String())
	if _, err := os.Stat(filepath.Join(dst, "info.json")); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(b.basesDir(), 0o700); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(b.basesDir(), ".new-")
	if err != nil {
		return "", err
	}
	defer removeTree(tmp)
	root := filepath.Join(tmp, "root")
	if err := createSubvolume(root); err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	// The base is the operator's own image, so its device nodes are allowed.
	if _, err := fstree.Materialise(ctx, tree, root, fstree.ApplyOptions{Loader: loader, IDs: b.opts.IDs, AllowDevices: true, Plain: true, Workers: fstree.ParallelWorkers()}); err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	res, err := fstree.Scan(ctx, root, fstree.ScanOptions{IDs: b.opts.IDs})
	if err != nil {
		return "", err
	}
	if res.Root != tree {
		return "", fmt.Errorf("base %s: materialised copy hashes to %s: %w", tree.Short(), res.Root.Short(), errdefs.ErrCorrupt)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return "", err
	}
	// Commit everything, then freeze: the base's generation must be final
	// before any sandbox is snapshotted from it.
	if err := syncFS(root); err != nil {
		return "", err
	}
	gen, err := maxTransid(root)
	if err != nil {
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	if err := setReadOnly(root, true); err != nil {
		return "", err
	}
	if err := writeJSON(filepath.Join(tmp, "info.json"), baseInfo{Tree: tree, Gen: gen}); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		if _, serr := os.Stat(filepath.Join(dst, "info.json")); serr == nil {
			return dst, nil // another process imported it meanwhile
		}
		return "", fmt.Errorf("base %s: %w", tree.Short(), err)
	}
	return dst, nil
}

// maxTransid returns the highest transaction of any inode of a subvolume.
// It reads the whole inode index once, when a base is imported.
func maxTransid(p string) (uint64, error) {
	fd, err := openDir(p)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var gen uint64
	err = changedInodes(fd, 0, func(_ uint64, it inodeItem) error {
		gen = max(gen, it.Transid)
		return nil
	})
	return gen, err
}

func readBaseInfo(dir string) (baseInfo, error) {
	var bi baseInfo
	data, err := readFile(filepath.Join(dir, "info.json"))
	if err != nil {
		return bi, fmt.Errorf("base %s: %w", dir, err)
	}
	if err := json.Unmarshal(data, &bi); err != nil || bi.Gen == 0 {
		return bi, fmt.Errorf("base %s: bad info.json: %w", dir, errdefs.ErrCorrupt)
	}
	return bi, nil
}

func writeJSON(p string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFile(p, data)
}

// Create lays out a new sandbox in dir (which must not exist) on the base
// prepared in base, with tree as its writable layer, and mounts it. A local
// restore point of tree on the same base, in this sandbox pool, is
// snapshotted (no data copied); otherwise tree is applied from the store.
func (b *Backend) Create(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (rootfs.Root, error) {
	r, err := b.CreateRoot(ctx, dir, base, tree, loader)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// CreateRoot is Create returning the concrete root.
func (b *Backend) CreateRoot(ctx context.Context, dir, base string, tree delta.ID, loader delta.BlobLoader) (*Root, error) {
	bi, err := readBaseInfo(base)
	if err != nil {
		return nil, err
	}
	if filepath.Dir(base) != b.basesDir() {
		return nil, fmt.Errorf("base %s is not in pool %s: %w", base, b.pool, errdefs.ErrInvalid)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox dir %s: %w", dir, errdefs.ErrExists)
		}
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	r := b.OpenRoot(dir, base)
	ok := false
	defer func() {
		if !ok {
			r.Remove(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(b.sandboxesDir(), 0o700); err != nil {
		return nil, err
	}
	sbDir, err := os.MkdirTemp(b.sandboxesDir(), filepath.Base(dir)+"-")
	if err != nil {
		return nil, err
	}
	// The link comes first, so that Remove finds everything made after it.
	if err := os.Symlink(sbDir, filepath.Join(dir, "pool")); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(sbDir, "info.json"), sandboxInfo{Base: bi.Tree}); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o755); err != nil {
		return nil, err
	}
	if err := r.install(ctx, sbDir, tree, loader); err != nil {
		return nil, err
	}
	if err := r.Mount(ctx); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// sandboxInfo is what a sandbox's pool directory records about it.
type sandboxInfo struct {
	Base delta.ID `json:"base"`
}

// Open returns the root kept in dir on base without touching it; base may be
// empty for operations that do not need it (Path, Remove).
func (b *Backend) Open(dir, base string) rootfs.Root { return b.OpenRoot(dir, base) }

// OpenRoot is Open returning the concrete root.
func (b *Backend) OpenRoot(dir, base string) *Root {
	return &Root{b: b, dir: dir, base: base, staged: map[*fstree.ScanResult]*stagedScan{}}
}

var _ rootfs.Backend = (*Backend)(nil)
