package btrfs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/fstree"
)

// writeState writes a scan's records and then its head into meta.
func (r *Root) writeState(meta metaDir, st *stagedScan) error {
	if st.rebuild {
		if err := os.RemoveAll(filepath.Join(string(meta), "r")); err != nil {
			return err
		}
	}
	for _, rec := range st.res.recs {
		if err := meta.writeRecord(rec); err != nil {
			return err
		}
	}
	for _, k := range st.res.drop {
		if err := meta.deleteRecord(k); err != nil {
			return err
		}
	}
	if st.res.linksDirt || st.rebuild {
		if err := meta.writeLinks(st.res.links); err != nil {
			return err
		}
	}
	return meta.writeHead(st.head)
}

// Committed records the scan res as the state of the last committed
// checkpoint: its records become the base of the next scan, and its
// snapshot becomes the checkpoint's local restore point. Call it only once
// the checkpoint holding res is committed.
func (r *Root) Committed(res *fstree.ScanResult) error {
	st := r.staged[res]
	if st == nil {
		return nil // nothing changed since the state on disk
	}
	delete(r.staged, res)
	sbDir, g, err := r.gen()
	if err != nil {
		return err
	}
	meta := metaDir(filepath.Join(g, "meta"))
	st.head.Pending = nil // the checkpoint stored every tree of res
	if st.advanced {
		err = meta.writeHead(st.head)
	} else {
		err = r.writeState(meta, st)
	}
	if err != nil {
		removeTree(st.dir)
		return fmt.Errorf("sandbox %s: save scan state: %w", r.dir, err)
	}
	_, bi, err := r.baseDir(sbDir)
	if err != nil {
		return err
	}
	if err := r.keepPoint(sbDir, st.dir, string(meta), res.Root, bi.Tree); err != nil {
		return fmt.Errorf("sandbox %s: restore point: %w", r.dir, err)
	}
	if err := r.prune(sbDir, r.b.opts.Keep); err != nil {
		r.b.opts.Logger.Warn("btrfs restore points not pruned", "sandbox", r.dir, "err", err)
	}
	// Leave nothing unwritten or uncommitted (records, the point's info),
	// so the next unchanged turn's generation check finds an idle
	// filesystem.
	return syncFS(sbDir)
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
