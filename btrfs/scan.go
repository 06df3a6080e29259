package btrfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"golang.org/x/sys/unix"
)

// stagedScan is a scan snapshot waiting for its checkpoint to commit.
type stagedScan struct {
	// dir is POOL/sandboxes/SID/.scan-XXXX and snap the read-only snapshot
	// dir/root. The directory, not the snapshot, is renamed into place as a
	// restore point: btrfs refuses to rename a read-only subvolume itself.
	dir      string
	snap     string
	head     *head // the state it describes
	res      *walkResult
	rebuild  bool // the records were rebuilt from the base: replace them all
	advanced bool // the records were written already (a skip turn)
}

// Scan returns the writable layer in overlay upper form, looking only at
// what changed since the last committed scan. saver may be nil (hash only).
//
// When no inode of the live subvolume changed after the last committed
// scan's snapshot, it returns that scan's result without reading anything:
// a commit and a filesystem sync, each followed by one tree-search ioctl
// that finds nothing newer. The syncs make the check exact: btrfs keeps
// inode updates as delayed items until a commit, and updates an inode's
// item for a buffered write only when the data is written back. On an idle
// filesystem they cost next to nothing. (A neighbour sandbox's unwritten
// data on the same filesystem is written back too: work brought forward,
// not added.)
// Otherwise it takes a read-only snapshot, the consistent cut it scans and
// the restore point Committed keeps, and derives the layer from the changed
// inodes and the directories above them.
func (r *Root) Scan(ctx context.Context, saver delta.BlobSaver) (*fstree.ScanResult, error) {
	sbDir, g, err := r.gen()
	if err != nil {
		return nil, err
	}
	live, meta := filepath.Join(g, "live"), metaDir(filepath.Join(g, "meta"))
	base, bi, err := r.baseDir(sbDir)
	if err != nil {
		return nil, err
	}
	h, rebuild := r.loadHead(live, meta, base, bi)
	if !rebuild {
		changed, err := changedSince(live, h.Gen)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
		if !changed {
			if err := resavePending(ctx, r.b.opts.IDs, meta, h.Pending, nil, saver); err != nil {
				return nil, err
			}
			return &fstree.ScanResult{Root: h.Root, StateKey: h.Key}, nil
		}
	}
	return r.scanSnapshot(ctx, sbDir, g, filepath.Join(base, "root"), bi, h, rebuild, saver)
}

// loadHead returns the state the live subvolume's records describe, or a
// state to rebuild from the base if they are missing or belong to another
// subvolume.
func (r *Root) loadHead(live string, meta metaDir, base string, bi baseInfo) (*head, bool) {
	h, err := meta.readHead()
	if err == nil {
		si, serr := getSubvolInfo(live)
		if serr == nil && (h.Basis == uuidString(si.ParentUUID) || h.BasisParent == uuidString(si.UUID)) {
			return h, false
		}
		err = serr
	}
	r.b.opts.Logger.Warn("btrfs scan state unusable, rebuilding it from the base (reads every changed file once)",
		"sandbox", r.dir, "err", err)
	return emptyHead(r.b.opts.IDs, bi), true
}

// emptyHead is the state of a sandbox equal to its base.
func emptyHead(ids delta.IDs, bi baseInfo) *head {
	return &head{Gen: bi.Gen, Root: ids.EmptyTree(), Key: ids.EmptyTree()}
}

// changedSince reports whether an inode of the live subvolume p changed
// after gen. Most changes (creates, unlinks, renames, truncates, metadata)
// show once btrfs's delayed inode items are committed, which costs nothing
// on an idle filesystem; only if none shows is buffered data written back,
// since that alone updates an inode for a plain write, to be sure. Either
// way the snapshot that follows a positive answer does the writeback once.
func changedSince(p string, gen uint64) (bool, error) {
	if err := startSync(p); err != nil {
		return false, err
	}
	changed, err := anyChanged(p, gen)
	if changed || err != nil {
		return changed, err
	}
	if err := syncFS(p); err != nil {
		return false, err
	}
	return anyChanged(p, gen)
}

// anyChanged reports whether an inode of subvolume p changed after gen.
func anyChanged(p string, gen uint64) (bool, error) {
	fd, err := openDir(p)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	found := false
	err = searchInodes(fd, gen, smallSearchBufSize, func(uint64, inodeItem) error {
		found = true
		return errStop
	})
	return found, err
}

// resavePending saves the trees of the pending directories as the scanned
// state has them: cur's record of a directory if the walk changed it, else
// the one in meta (cur nil: nothing changed). It runs after the walk, not
// before: a pending tree the walk replaced (the root's, when the skip that
// left it pending was followed by a change) is named by no checkpoint, and
// storing it would count a reference to each of its children that no
// record holds (check.CountRefs). A directory the walk dropped is skipped.
func resavePending(ctx context.Context, ids delta.IDs, meta metaDir, pending []recKey, cur *walkResult, saver delta.BlobSaver) error {
	if saver == nil {
		return nil
	}
	for _, k := range pending {
		if cur != nil && slices.Contains(cur.drop, k) {
			continue
		}
		rec := (*record)(nil)
		if cur != nil {
			rec = cur.recs[k]
		}
		var err error
		if rec == nil {
			rec, err = meta.readRecord(k)
		}
		if err != nil || rec == nil {
			return fmt.Errorf("scan state: pending tree of inode %d: %v", k.Ino, err)
		}
		if _, err := saver.SaveBlob(ctx, delta.BlobTree, ids.Hash(rec.Tree), rec.Tree); err != nil {
			return err
		}
	}
	return nil
}

func randomName(prefix string) string {
	var b [8]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// scanSnapshot snapshots the live subvolume and scans the snapshot.
func (r *Root) scanSnapshot(ctx context.Context, sbDir, g, baseRoot string, bi baseInfo, h *head, rebuild bool, saver delta.BlobSaver) (*fstree.ScanResult, error) {
	r.dropStaleScans(sbDir)
	live, meta := filepath.Join(g, "live"), metaDir(filepath.Join(g, "meta"))
	dir, err := takeScanSnapshot(sbDir, live)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	st, err := r.scanOne(ctx, dir, baseRoot, bi, meta, h, rebuild, saver)
	if errors.Is(err, errStale) && !rebuild {
		r.b.opts.Logger.Warn("btrfs scan records inconsistent, rebuilding them from the base", "sandbox", r.dir, "err", err)
		st, err = r.scanOne(ctx, dir, baseRoot, bi, meta, emptyHead(r.b.opts.IDs, bi), true, saver)
	}
	if err != nil {
		removeTree(dir)
		return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
	}
	if !st.staged.rebuild { // a rebuild's walk saved every tree
		if err := resavePending(ctx, r.b.opts.IDs, meta, h.Pending, st.staged.res, saver); err != nil {
			removeTree(dir)
			return nil, fmt.Errorf("sandbox %s: %w", r.dir, err)
		}
	}
	out := &fstree.ScanResult{Root: st.head.Root, StateKey: st.head.Key, Stats: st.stats}
	r.staged[out] = st.staged
	if rebuild || st.head.Root == h.Root || st.head.Key == h.Key {
		// The engine will not checkpoint this (nothing, or nothing but
		// directory mtimes, changed), or the records were rebuilt: move the
		// records forward now so the next turn starts from here. Trees the
		// store may lack stay pending until a checkpoint stores them.
		nh := *st.head
		nh.Pending = slices.DeleteFunc(slices.Clone(h.Pending), func(k recKey) bool { return slices.Contains(st.staged.res.drop, k) })
		if rebuild || st.head.Root != h.Root {
			for k := range st.staged.res.recs {
				nh.Pending = append(nh.Pending, k)
			}
		}
		st.staged.head = &nh
		if err := r.writeState(meta, st.staged); err != nil {
			return nil, fmt.Errorf("sandbox %s: save scan state: %w", r.dir, err)
		}
		st.staged.advanced = true
		if err := syncFS(live); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type scanned struct {
	staged *stagedScan
	head   *head
	stats  fstree.ScanStats
}

// takeScanSnapshot snapshots live read-only as dir/root in a new scan
// directory of sbDir. The snapshot ioctl writes back the subvolume's
// buffered data first, so every write made before it shows in the inode
// generations the scan reads.
func takeScanSnapshot(sbDir, live string) (string, error) {
	dir := filepath.Join(sbDir, randomName(".scan-"))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	if err := snapshot(live, filepath.Join(dir, "root"), true); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// scanOne walks the snapshot dir/root from state h.
func (r *Root) scanOne(ctx context.Context, dir, baseRoot string, bi baseInfo, meta metaDir, h *head, rebuild bool, saver delta.BlobSaver) (*scanned, error) {
	snap := filepath.Join(dir, "root")
	si, err := getSubvolInfo(snap)
	if err != nil {
		return nil, err
	}
	prevMeta := meta
	if rebuild {
		prevMeta = ""
	}
	w, err := newWalker(ctx, r.b.opts.IDs, snap, baseRoot, bi.Gen, saver, prevMeta, h)
	if err != nil {
		return nil, err
	}
	defer w.close()
	res, err := w.run()
	if cerr := w.closeFiles(); err == nil && cerr != nil {
		err = fmt.Errorf("scan %s: %w", snap, cerr)
	}
	if err != nil {
		return nil, err
	}
	nh := &head{
		Basis: uuidString(si.UUID), BasisParent: uuidString(si.ParentUUID), Gen: si.Otransid,
		Root: res.root, Key: res.key,
	}
	return &scanned{staged: &stagedScan{dir: dir, snap: snap, head: nh, res: res, rebuild: rebuild}, head: nh, stats: w.stats}, nil
}

// dropStaleScans deletes every scan snapshot in sbDir before a new scan:
// a checkpoint commits the result of its own, latest scan, so earlier ones
// (a skipped or failed turn's, a diff's, a crashed process's) are not
// needed any more.
func (r *Root) dropStaleScans(sbDir string) {
	clear(r.staged)
	names, _ := readNames(sbDir)
	for _, n := range names {
		if strings.HasPrefix(n, ".scan-") {
			removeTree(filepath.Join(sbDir, n))
		}
	}
}
