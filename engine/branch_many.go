package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/receipt"
	"github.com/turnsnap/turnsnap/engine/room"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// MaxBranchMany bounds one fan-out: each branch is a mount and a sandbox.
const MaxBranchMany = 1024

// BranchNames returns the names a fan-out of count branches called prefix
// gets: prefix-1 ... prefix-count (the CLI's `branch CKPT NAME --count N`).
func BranchNames(prefix string, count int) ([]string, error) {
	if count < 1 || count > MaxBranchMany {
		return nil, fmt.Errorf("branch count %d: want 1 to %d: %w", count, MaxBranchMany, errdefs.ErrInvalid)
	}
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i+1)
	}
	return out, nil
}

// BranchMany creates one sandbox per name, each equal to checkpoint ref
// (Branch is BranchMany of one name). It checks the checkpoint's tree,
// host, process image and base once, and records every new sandbox in one
// catalog transaction: all are created or none is. On overlay with the
// checkpoint's frozen layer kept here, each branch only mounts a stack
// (overlay/frozen). The results are in the order of names.
func (e *Engine) BranchMany(ctx context.Context, ref catalog.CheckpointRef, names []delta.SandboxName, o BranchOptions) ([]*RestoreResult, error) {
	if len(names) == 0 || len(names) > MaxBranchMany {
		return nil, fmt.Errorf("branch into %d sandboxes: want 1 to %d: %w", len(names), MaxBranchMany, errdefs.ErrInvalid)
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i, n := range sorted {
		if !delta.ValidRefName(string(n)) {
			return nil, fmt.Errorf("sandbox name %q: use 1-64 of [A-Za-z0-9._-], not starting with '.' or '-': %w", n, errdefs.ErrInvalid)
		}
		if i > 0 && sorted[i-1] == n {
			return nil, fmt.Errorf("sandbox name %q given twice: %w", n, errdefs.ErrInvalid)
		}
	}
	// The engine's shared lock once, then every name's lock in one order,
	// so two fan-outs sharing names cannot deadlock.
	e.locks.maint.RLock()
	defer e.locks.maint.RUnlock()
	for _, n := range sorted {
		unlock, err := e.locks.sandboxes.lock(ctx, string(n))
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	start := time.Now()
	ph := &BranchPhases{}
	mark := start
	cp, err := e.resolveFor(ctx, "", ref)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := e.checkNewSandbox(ctx, string(n)); err != nil {
			return nil, err
		}
	}
	// Errors of the steps all branches share name them.
	strs := make([]string, len(names))
	for i, n := range names {
		strs[i] = string(n)
	}
	subject := "sandbox " + strs[0]
	if len(names) > 1 {
		subject = "sandboxes " + strings.Join(strs, ", ")
	}
	var cfg json.RawMessage
	if o.Backend == "" {
		o.Backend = cp.Backend
		// Never another home's pool (foreign.go).
		if cfg, err = branchConfig(ctx, e.cat, e.home, e.config.HomeID, cp); err != nil {
			return nil, fmt.Errorf("%s: %w", subject, err)
		}
	} else if cfg, err = backendConfig(o.Backend, o.Btrfs); err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	if !o.FSOnly {
		if err := e.procs.CheckHost(ctx, cp); err != nil {
			return nil, err
		}
	}
	be, err := e.backend(o.Backend, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	// Through the memo a rollback uses: a tree's check is a function of
	// its ID, and reading every tree of a 50,000-file layer again was
	// nearly all of a ready fan-out's time (BenchmarkScaleBigRepoTurns).
	fp, err := e.memo.checked.CheckState(ctx, fstree.NewCheckedLoader(e.memo.checked.Loader(e.data.repo)), cp.FSTree)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: tree %s: %w", cp.ID.Short(), cp.FSTree.Short(), err)
	}
	imgStart := time.Now()
	img, cleanImg, err := e.readyImage(ctx, cp, o.FSOnly)
	if err != nil {
		return nil, err
	}
	defer cleanImg()
	ph.Image = time.Since(imgStart)
	baseStart := time.Now()
	lower, err := e.prepareBase(ctx, be, cp.BaseTree, e.data.repo)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	if _, err := checkBaseOn(ctx, be, cp.BaseTree, false); err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	ph.Base = time.Since(baseStart)
	if err := ensureDir(filepath.Dir(e.home.sandboxDir(names[0]))); err != nil {
		return nil, err
	}
	stacked := false
	if f, ok := be.(rootfs.Freezer); ok && !o.Materialise {
		layerStart := time.Now()
		if stacked, err = f.PrepareBranch(ctx, cp, fp.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", subject, err)
		}
		ph.Layer = time.Since(layerStart)
	}
	// As for a rollback (restore.go): roots copied into the home must
	// leave the catalog its room. A stacked root copies nothing.
	if rootsInHome(o.Backend) && !stacked {
		if err := room.Check(string(e.home), e.cat, fp.Bytes*uint64(len(names)), 0); err != nil {
			return nil, fmt.Errorf("%s: branch of %s: %w", subject, cp.ID.Short(), err)
		}
	}
	unmark, err := e.leftovers().Creating(strs, o.Backend, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	e.progressPhase("restore", int64(fp.Bytes)*int64(len(names)))
	ph.Prepare = lap(&mark)
	// The roots are independent (a mount each, or a copy each): make them
	// side by side, so their directory syncs share journal commits.
	roots := make([]rootfs.Root, len(names))
	errs := make([]error, len(names))
	parallel(len(names), func(i int) {
		roots[i], errs[i] = branchRoot(ctx, be, e.home.sandboxDir(names[i]), lower, cp, o.Materialise, e.data.repo)
		if errs[i] != nil && len(names) > 1 {
			// One branch's root names its sandbox already.
			errs[i] = fmt.Errorf("sandbox %s: %w", names[i], errs[i])
		}
	})
	undo := func() {
		ok := true
		for _, r := range roots {
			if r != nil && r.Remove(context.WithoutCancel(ctx)) != nil {
				ok = false
			}
		}
		if ok {
			unmark() // else the next create, branch or rm of the name removes it
		}
	}
	if err := errors.Join(errs...); err != nil {
		undo()
		return nil, err
	}
	ph.Roots = lap(&mark)
	sbs := make([]*delta.Sandbox, len(names))
	for i, n := range names {
		sbs[i] = &delta.Sandbox{ID: delta.NewSandboxID(), Home: e.config.HomeID, Name: n, Backend: o.Backend, Config: cfg,
			BaseTree: cp.BaseTree, Origin: cp.ID, Created: time.Now().UTC()}
	}
	e.phase("branch: roots made") // the catalog does not know them yet
	if err := e.publishSandboxes(ctx, sbs, cp.ID); err != nil {
		undo()
		return nil, err
	}
	unmark()
	ph.Catalog = lap(&mark)
	out := make([]*RestoreResult, len(names))
	for i, n := range names {
		out[i] = &RestoreResult{Sandbox: string(n), Checkpoint: cp, Root: roots[i].Path(), Phases: ph}
	}
	// Each branch's receipt (engine/receipt): its files checked, side by side
	// (a scan of its own root each), then its processes restored and
	// checked, side by side too (fanout_procs.go).
	procs := cp.ProcTree != nil && !o.FSOnly
	parallel(len(names), func(i int) {
		out[i].Receipt = e.receipts.Files(ctx, "branch", strs[i], roots[i], cp, branchWritten(roots[i]), delta.ID{})
	})
	ph.Files = lap(&mark)
	procErr := restoreBranchProcesses(ctx, e.receipts, out, roots, cp, img, procs)
	ph.Processes = lap(&mark)
	d := time.Since(start)
	bad := []error{procErr}
	for _, r := range out {
		r.Duration = d
		if !r.Receipt.OK {
			bad = append(bad, e.receipts.Fail(ctx, r.Receipt))
		}
	}
	return out, errors.Join(bad...)
}

// branchWritten says how a branch's root was verified as it was made.
func branchWritten(root rootfs.Root) string {
	if r, ok := root.(interface{ Stacked() bool }); ok && r.Stacked() {
		return receipt.WrittenHow(root, rootfs.RestoreInfo{}, true)
	}
	return receipt.WrittenHow(root, rootfs.RestoreInfo{}, false)
}

// publishSandboxes records sandboxes whose head is an existing checkpoint:
// their objects first, then one catalog transaction for all.
func (e *Engine) publishSandboxes(ctx context.Context, sbs []*delta.Sandbox, head delta.ID) error {
	// Each object put syncs its file and directory; side by side the
	// syncs share journal commits.
	errs := make([]error, len(sbs))
	parallel(len(sbs), func(i int) {
		if errs[i] = putSandboxObject(ctx, e.stores.front, sbs[i]); errs[i] == nil {
			errs[i] = putRefObject(ctx, e.stores.front, delta.RefHead, string(sbs[i].Key()), head)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return e.cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, sb := range sbs {
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
			if err := e.rem.QueueRef(tx, string(sb.Name), delta.HeadObject(sb.Key()), head, delta.SandboxObject(sb.Key())); err != nil {
				return err
			}
			if err := tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: string(sb.Name), Target: head}); err != nil {
				return err
			}
		}
		return nil
	})
}

// fanOutWorkers bounds the goroutines of one fan-out: the work is syscalls
// waiting on the disk (syncs, mounts), not CPU, so more than the cores.
const fanOutWorkers = 8

// parallel runs fn(0) ... fn(n-1) on up to fanOutWorkers goroutines.
func parallel(n int, fn func(i int)) { parallelN(n, fanOutWorkers, fn) }

// parallelN runs fn(0) ... fn(n-1) on up to workers goroutines.
func parallelN(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, max(workers, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
