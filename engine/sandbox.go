package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
	"github.com/turnsnap/turnsnap/overlay"
)

// CreateOptions configures CreateSandbox.
type CreateOptions struct {
	Base    string // directory imported as the read-only base
	Backend string // "overlay" (default) or "btrfs"
	// Btrfs holds the btrfs backend's settings, kept with the sandbox: its
	// Pool is a directory on a mounted btrfs filesystem.
	Btrfs btrfs.Options
}

// CreateResult reports a new sandbox.
type CreateResult struct {
	Sandbox    *delta.Sandbox
	Checkpoint *delta.Checkpoint // turn 0: the base, unchanged
	Root       string
	BaseStats  fstree.ScanStats
	Duration   time.Duration
}

// CreateSandbox imports the base into the store (content-addressed, so a
// second sandbox on the same base adds no bytes), materialises it once per
// host as the overlay lower dir, mounts the sandbox, and commits turn 0.
func (e *Engine) CreateSandbox(ctx context.Context, name delta.SandboxName, opts CreateOptions) (*CreateResult, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return nil, err
	}
	defer done()
	start := time.Now()
	e.progressPhase("import base", 0)
	if !delta.ValidRefName(string(name)) {
		return nil, fmt.Errorf("sandbox name %q: use 1-64 of [A-Za-z0-9._-], not starting with '.' or '-': %w", name, errdefs.ErrInvalid)
	}
	if opts.Backend == "" {
		opts.Backend = defaultBackend
	}
	cfg, err := backendConfig(opts.Backend, opts.Btrfs)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	be, err := e.backend(opts.Backend, cfg)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	if err := e.checkNewSandbox(ctx, string(name)); err != nil {
		return nil, err
	}
	base, err := filepath.Abs(opts.Base)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("sandbox %s: base %s is not a readable directory: %w", name, opts.Base, errdefs.ErrInvalid)
	}
	op := e.data.repo.Begin()
	defer op.Discard(context.WithoutCancel(ctx)) // only what a failed import wrote
	res, err := fstree.Scan(ctx, base, fstree.ScanOptions{Saver: op, IDs: e.keys.IDs()})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: import base: %w", name, err)
	}
	empty := e.keys.IDs().EmptyTree()
	if _, err := op.SaveBlob(ctx, delta.BlobTree, empty, (&delta.Tree{}).Encode()); err != nil {
		return nil, err
	}
	if err := op.Publish(ctx); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	// The base just imported is made ready on this host from its files in
	// base rather than loaded back from the store (fstree.Source: no second
	// read of the packs, decompression and hashing of 1.4 GiB on a big
	// repository); the backend verifies the copy against the tree before
	// it publishes it, as it always does. If base changed since the scan
	// the copy does not verify, and the base is materialised from the
	// store alone, which holds what was imported.
	lower, err := e.prepareBase(ctx, be, res.Root, fstree.Source{BlobLoader: op, Dir: base})
	if errors.Is(err, errdefs.ErrCorrupt) {
		e.log.Warn("the base changed while it was imported; materialising it from the store", "base", base, "tree", res.Root.Short(), "err", err)
		lower, err = e.prepareBase(ctx, be, res.Root, op)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	if err := ensureDir(filepath.Dir(e.home.sandboxDir(name))); err != nil {
		return nil, err
	}
	unmark, err := e.leftovers().Creating([]string{string(name)}, opts.Backend, cfg)
	if err != nil {
		return nil, err
	}
	root, err := be.Create(ctx, e.home.sandboxDir(name), lower, empty, e.data.repo)
	if err != nil {
		unmark()
		return nil, err
	}
	sb := &delta.Sandbox{ID: delta.NewSandboxID(), Home: e.config.HomeID, Name: name, Backend: opts.Backend,
		BaseTree: res.Root, Created: time.Now().UTC(), Config: cfg}
	cp := &delta.Checkpoint{
		Version: delta.RecordVersion, Sandbox: delta.SandboxName(name), SandboxID: sb.ID, Turn: 0, Class: delta.ClassFS,
		Backend: opts.Backend, BaseTree: res.Root, FSTree: empty,
		// An empty layer's state key is the empty tree's (Create leaves the
		// root scanned and its cache written, as Branch relies on too).
		StateKey: empty,
		Message:  "sandbox created from " + base, Created: time.Now().UTC(),
		Stats: op.Stats(),
	}
	cp.Stats.Entries, cp.Stats.FilesRead, cp.Stats.BytesRead = res.Stats.Entries, res.Stats.FilesRead, res.Stats.BytesRead
	cp.Stats.DurationNs = time.Since(start).Nanoseconds()
	if err := e.commit(ctx, op, cp, sb, cp.Roots()); err != nil {
		if root.Remove(context.WithoutCancel(ctx)) == nil {
			unmark()
		}
		return nil, err
	}
	unmark()
	return &CreateResult{Sandbox: sb, Checkpoint: cp, Root: root.Path(), BaseStats: res.Stats, Duration: time.Since(start)}, nil
}

func (e *Engine) checkNewSandbox(ctx context.Context, name string) error {
	err := e.view(ctx, func(tx *catalog.Tx) error {
		_, err := tx.Sandbox(delta.SandboxName(name))
		return err
	})
	if err == nil {
		return fmt.Errorf("sandbox %s: %w", name, errdefs.ErrExists)
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if _, err := os.Lstat(e.home.sandboxDir(delta.SandboxName(name))); err == nil {
		// A root no catalog entry names: a killed create or branch's is
		// removed here (engine/leftover); any other is the operator's call.
		l := e.leftovers()
		m := l.Find(name)
		if m == nil {
			return l.ErrUnknown(name)
		}
		return l.Remove(ctx, name, m)
	}
	return nil
}

// commit publishes a checkpoint in the write order of docs/FORMAT.md:
// packs, the record, the sandbox description (if new) and head ref
// objects, and last the catalog transaction that makes it visible, which
// also indexes a small turn's blobs (a large one's are indexed before the
// record, in transactions of their own: content.Op.Stage).
func (e *Engine) commit(ctx context.Context, op *content.Op, cp *delta.Checkpoint, newSandbox *delta.Sandbox, roots []delta.ID) error {
	staged, err := op.Stage(ctx, roots...)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", cp.Sandbox, err)
	}
	st := op.Stats()
	cp.Stats.BlobsNew, cp.Stats.BytesNew, cp.Stats.ObjectsNew = st.BlobsNew, st.BytesNew, st.ObjectsNew
	if err := putRecord(ctx, e.stores.front, cp); err != nil {
		// A Put can fail after its rename ("written but maybe not
		// durable"): a record that names the op's packs keeps them.
		if _, serr := e.stores.front.Stat(context.WithoutCancel(ctx), delta.RecordName(cp.ID)); serr == nil {
			op.Keep()
		}
		return err
	}
	// The record names the op's packs: a commit that fails from here on
	// must not delete them (gc and a rebuild go by the record).
	op.Keep()
	if newSandbox != nil {
		if err := putSandboxObject(ctx, e.stores.front, newSandbox); err != nil {
			return err
		}
	}
	if err := putRefObject(ctx, e.stores.front, delta.RefHead, string(cp.SandboxKey()), cp.ID); err != nil {
		return err
	}
	e.phase(PhaseRecorded)
	// One commit transaction at a time: with a remote, each reads the
	// whole upload queue and bumps its sequence, so concurrent ones would
	// conflict and retry. Concurrent commits share one (a group commit,
	// run under commitLock): each sees the ones before it in the
	// transaction, and one fsync makes them all durable.
	err = e.locks.commits.Update(ctx, e.cat, func(tx *catalog.Tx) error {
		if err := staged.Index(tx); err != nil {
			return err
		}
		if newSandbox != nil {
			if err := tx.PutSandbox(newSandbox); err != nil {
				return err
			}
		}
		if err := tx.PutCheckpoint(cp); err != nil {
			return err
		}
		if err := e.rem.QueueCommit(tx, op, cp, newSandbox); err != nil {
			return err
		}
		return tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: string(cp.Sandbox), Target: cp.ID})
	})
	if err != nil {
		return fmt.Errorf("checkpoint %s of sandbox %s: catalog: %w", cp.ID.Short(), cp.Sandbox, err)
	}
	staged.Done()
	return nil
}

// SandboxInfo is one sandbox with its head.
type SandboxInfo struct {
	Sandbox *delta.Sandbox
	Head    *delta.Checkpoint
	Root    string
}

// ListSandboxes returns every sandbox with its head checkpoint.
func (e *Engine) ListSandboxes(ctx context.Context) ([]SandboxInfo, error) {
	defer e.shared()()
	var out []SandboxInfo
	err := e.view(ctx, func(tx *catalog.Tx) error {
		sbs, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			info := SandboxInfo{Sandbox: sb}
			if be, err := e.backend(sb.Backend, sb.Config); err == nil {
				info.Root = be.Open(e.home.sandboxDir(sb.Name), "").Path()
			}
			// A sandbox with no head yet lists without one; any other
			// read error is the listing's.
			id, err := tx.GetRef(delta.RefHead, string(sb.Name))
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("sandbox %s: head: %w", sb.Name, err)
			}
			if err == nil {
				if info.Head, err = tx.Checkpoint(id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					return fmt.Errorf("sandbox %s: head %s: %w", sb.Name, id.Short(), err)
				}
			}
			out = append(out, info)
		}
		return nil
	})
	return out, err
}

// sandboxState is what most operations need about a sandbox, read once
// per operation: its catalog name (also the key of its lock, its turn
// tracker and its memos), its key (its objects in the store), its
// container, its description, head and root.
type sandboxState struct {
	name      delta.SandboxName
	key       delta.SandboxKey
	container procs.Container
	sb        *delta.Sandbox
	head      *delta.Checkpoint
	root      rootfs.Root
	owner     delta.Owner // who may write its head (engine/remote/owner.go)
	// interrupted is what an interrupted operation left (engine/intent), as
	// far as the load did not finish it: nil when nothing.
	interrupted *Interrupted
}

func (e *Engine) loadSandbox(ctx context.Context, name delta.SandboxName) (*sandboxState, error) {
	st, be, lower, err := e.readSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(e.home.sandboxDir(name)); err != nil {
		// Known to the catalog but absent here (a rebuilt catalog on a new
		// host): bring the head's state back from the store.
		if err := ensureDir(filepath.Dir(e.home.sandboxDir(name))); err != nil {
			return nil, err
		}
		if st.root, err = be.Create(ctx, e.home.sandboxDir(name), lower, st.head.FSTree, e.data.repo); err != nil {
			return nil, err
		}
	}
	intents := e.intents()
	if !e.opts.ReadOnly {
		// Finishing writes the catalog: a read-only home reports the
		// interrupted work (st.interrupted) and leaves it to a writer.
		if in, ok := intents.Pending(st.sb); ok {
			if st.head, err = intents.Finish(ctx, string(name), st.intentSandbox(e.home.sandboxDir(name)), in); err != nil {
				return nil, err
			}
		}
	}
	st.interrupted = intents.Interrupted(st.sb)
	if st.sb.Backend == overlay.Name {
		// A lazy restore a killed process left is taken over (or, cut off
		// before its placeholders were all made, its layer made again), so
		// the first use of the sandbox after a restart finishes it.
		redo := func(ctx context.Context, tree delta.ID) error { return st.root.Restore(ctx, tree, e.data.repo) }
		if err := e.lazy.Resume(ctx, name, e.home.sandboxDir(name), redo); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// viewSandbox is loadSandbox for commands that only read (ps, diff): an
// interrupted operation is reported in st.interrupted, never finished, so
// reading a sandbox never waits for or depends on someone else's work.
// A root absent here is not brought back.
func (e *Engine) viewSandbox(ctx context.Context, name delta.SandboxName) (*sandboxState, error) {
	st, _, _, err := e.readSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	st.interrupted = e.intents().Interrupted(st.sb)
	return st, nil
}

// readSandbox reads the sandbox's catalog entries and opens its root
// (without mounting or creating it).
func (e *Engine) readSandbox(ctx context.Context, name delta.SandboxName) (*sandboxState, rootfs.Backend, string, error) {
	st := &sandboxState{}
	err := e.view(ctx, func(tx *catalog.Tx) error {
		var err error
		if st.sb, err = tx.Sandbox(delta.SandboxName(name)); err != nil {
			return err // names the sandbox
		}
		id, err := tx.GetRef(delta.RefHead, string(name))
		if err != nil {
			return fmt.Errorf("sandbox %s: head: %w", name, err)
		}
		if st.head, err = tx.Checkpoint(id); err != nil {
			return err
		}
		st.owner, err = remote.OwnerOf(tx, st.sb)
		return err
	})
	if err != nil {
		return nil, nil, "", err
	}
	st.name, st.key, st.container = delta.SandboxName(name), st.sb.Key(), e.procs.Container(name)
	if !rootHere(e.home, e.config.HomeID, st.sb) {
		return nil, nil, "", errForeignRoot(st.sb)
	}
	be, err := e.backend(st.sb.Backend, st.sb.Config)
	if err != nil {
		return nil, nil, "", fmt.Errorf("sandbox %s: %w", name, err)
	}
	lower, err := e.prepareBase(ctx, be, st.head.BaseTree, e.data.repo)
	if err != nil {
		return nil, nil, "", fmt.Errorf("sandbox %s: %w", name, err)
	}
	st.root = be.Open(e.home.sandboxDir(name), lower)
	return st, be, lower, nil
}

// SandboxExists reports whether the catalog has sandbox name. It reads
// one catalog entry and waits for no operation on the sandbox, for a
// caller on a hot path (the LLM proxy refuses a route to a sandbox that
// does not exist before it forwards anything).
func (e *Engine) SandboxExists(ctx context.Context, name delta.SandboxName) (bool, error) {
	err := e.view(ctx, func(tx *catalog.Tx) error {
		_, err := tx.Sandbox(delta.SandboxName(name))
		return err
	})
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
		return false, nil // an invalid name names no sandbox
	}
	return err == nil, err
}

// SandboxPath returns the sandbox's mounted root, mounting it if needed.
func (e *Engine) SandboxPath(ctx context.Context, name delta.SandboxName) (string, error) {
	done, err := e.op(ctx, name)
	if err != nil {
		return "", err
	}
	defer done()
	st, err := e.loadSandbox(ctx, name)
	if err != nil {
		return "", err
	}
	if err := st.root.Mount(ctx); err != nil {
		return "", err
	}
	return st.root.Path(), nil
}

// RemoveSandbox unmounts and deletes a sandbox's root and forgets its head.
// Its checkpoints stay: other sandboxes may have branched from them, and
// they remain restorable until pruned.
func (e *Engine) RemoveSandbox(ctx context.Context, name delta.SandboxName) error {
	return e.RemoveSandboxWith(ctx, name, RemoveOptions{})
}

// PhaseRemoveCommitted: a removal's catalog transaction committed; the
// sandbox's root is still on disk.
const PhaseRemoveCommitted = "remove: catalog committed"

// RemoveOptions configures RemoveSandboxWith.
type RemoveOptions struct {
	// CatalogOnly forgets the sandbox (its description and head, here and,
	// at the next push, in the bucket) without touching its root or
	// processes: for a sandbox whose root is on another host.
	CatalogOnly bool `json:"catalog_only,omitempty"`
}

// RemoveSandboxWith is RemoveSandbox with options: CatalogOnly leaves the
// root and processes alone (a sandbox whose root is on another host).
func (e *Engine) RemoveSandboxWith(ctx context.Context, name delta.SandboxName, o RemoveOptions) error {
	done, err := e.op(ctx, name)
	if err != nil {
		return err
	}
	defer done()
	e.memo.headTrees.drop(string(name)) // only a cache: dropping it even if the removal fails costs a read
	var sb *delta.Sandbox
	if err := e.view(ctx, func(tx *catalog.Tx) error {
		var err error
		sb, err = tx.Sandbox(delta.SandboxName(name))
		return err
	}); err != nil {
		if o.CatalogOnly {
			return err
		}
		return e.leftovers().RemoveUnknown(ctx, string(name), err) // a killed create's or branch's root
	}
	if !o.CatalogOnly && !rootHere(e.home, e.config.HomeID, sb) {
		// Its root is on the host that recorded it: nothing here to
		// remove, and its recorded pool path must not be touched.
		e.log.Warn("sandbox root is on another host; forgetting the sandbox only", "sandbox", name)
		o.CatalogOnly = true
	}
	e.untrack(string(name)) // its descriptor on the root would keep it mounted
	// Its lazy restore's fills write into the root.
	e.lazy.Stop(name, e.home.sandboxDir(name))
	var be rootfs.Backend
	if !o.CatalogOnly {
		if err := e.procs.Stop(ctx, e.procs.Container(name)); err != nil {
			return err
		}
		if be, err = e.backend(sb.Backend, sb.Config); err != nil {
			be = nil // the backend's error may come with a typed nil
			// The root lives where this host cannot reach (a btrfs pool of
			// another host, unmounted): forget the sandbox, say what stays.
			e.log.Warn("sandbox root not reachable from this host; forgetting the sandbox, its root stays",
				"sandbox", name, "backend", sb.Backend, "err", err)
		}
	}
	// Metadata first, then the disk (as containerd removes): once the
	// catalog has forgotten the sandbox, a removal that fails or is killed
	// leaves only a root no entry names, which the creation marker written
	// here lets the next `sandbox rm NAME` (or create of NAME) remove. The
	// other order would leave a catalog entry whose root is half gone.
	unmark := func() {}
	if be != nil {
		if unmark, err = e.leftovers().Creating([]string{string(name)}, sb.Backend, sb.Config); err != nil {
			return err
		}
	}
	err = e.cat.Update(ctx, func(tx *catalog.Tx) error {
		if err := tx.DeleteRef(delta.RefHead, string(name)); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		if err := e.rem.QueueDelete(tx, string(name), delta.HeadObject(sb.Key()), delta.SandboxObject(sb.Key())); err != nil {
			return err
		}
		if sb.ID != "" && sb.Home == e.config.HomeID {
			// Its checkpoints stay, and stay this home's to prune.
			if err := tx.NoteRemovedOwnSandbox(sb.Key()); err != nil {
				return err
			}
		}
		return tx.DeleteSandbox(delta.SandboxName(name))
	})
	if err != nil {
		unmark()
		return err
	}
	e.phase(PhaseRemoveCommitted)
	// Local copies only: with a remote, the deletions queued above reach
	// the bucket in order at the next push. Left behind, they would bring
	// the sandbox back only to a catalog rebuild, which says so.
	for _, obj := range []string{delta.HeadObject(sb.Key()), delta.SandboxObject(sb.Key())} {
		if err := e.stores.local.Delete(ctx, obj); err != nil {
			e.log.Warn("sandbox removed; its local object stays", "sandbox", name, "object", obj, "err", err)
		}
	}
	if be != nil {
		if err := be.Open(e.home.sandboxDir(name), "").Remove(ctx); err != nil {
			e.log.Warn("sandbox removed from the catalog; its root stays until `turnsnap sandbox rm` of the name removes it",
				"sandbox", name, "dir", e.home.sandboxDir(name), "err", err)
		} else {
			unmark()
		}
	}
	// An interrupted rollback of the sandbox is discarded with it, never
	// finished, and never found by a later sandbox of this name.
	intents := e.intents()
	if err := intents.Clear(sb); err != nil {
		return err
	}
	intents.ClearProcsLost(sb)
	e.dropFrozen(ctx) // its frozen layers are kept for it no longer
	return nil
}
