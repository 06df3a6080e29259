package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
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

// BranchMany creates one sandbox per name, each equal to checkpoint ref,
// as Branch would one by one, but checks the checkpoint's tree, host,
// process image and base once, and records every new sandbox in one
// catalog transaction: all are created or none is. On overlay with the
// checkpoint's frozen layer kept here, each branch only mounts a stack
// (frozen.go). The results are in the order of names.
func (e *Engine) BranchMany(ctx context.Context, ref string, names []string, o BranchOptions) ([]*RestoreResult, error) {
	if len(names) == 0 || len(names) > MaxBranchMany {
		return nil, fmt.Errorf("branch into %d sandboxes: want 1 to %d: %w", len(names), MaxBranchMany, errdefs.ErrInvalid)
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i, n := range sorted {
		if !delta.ValidRefName(n) {
			return nil, fmt.Errorf("sandbox name %q: use 1-64 of [A-Za-z0-9._-], not starting with '.' or '-': %w", n, errdefs.ErrInvalid)
		}
		if i > 0 && sorted[i-1] == n {
			return nil, fmt.Errorf("sandbox name %q given twice: %w", n, errdefs.ErrInvalid)
		}
	}
	// The engine's shared lock once, then every name's lock in one order,
	// so two fan-outs sharing names cannot deadlock.
	e.maint.RLock()
	defer e.maint.RUnlock()
	for _, n := range sorted {
		unlock, err := e.sandboxes.lock(ctx, n)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	start := time.Now()
	cp, err := e.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := e.checkNewSandbox(ctx, n); err != nil {
			return nil, err
		}
	}
	var cfg json.RawMessage
	if o.Backend == "" {
		o.Backend = cp.Backend
		e.view(ctx, func(tx *catalog.Tx) error {
			if src, err := tx.Sandbox(cp.Sandbox); err == nil && src.Backend == cp.Backend {
				cfg = src.Config
			}
			return nil
		})
	} else if cfg, err = backendConfig(o.Backend, o.Btrfs); err != nil {
		return nil, err
	}
	if !o.FSOnly {
		if err := e.checkHost(ctx, cp); err != nil {
			return nil, err
		}
	}
	be, err := e.backend(o.Backend, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := delta.CheckState(ctx, e.repo, cp.FSTree, delta.StateRules{}); err != nil {
		return nil, fmt.Errorf("checkpoint %s: tree %s: %w", cp.ID.Short(), cp.FSTree.Short(), err)
	}
	img, cleanImg, err := e.readyImage(ctx, cp, o.FSOnly)
	if err != nil {
		return nil, err
	}
	defer cleanImg()
	lower, err := e.prepareBase(ctx, be, cp.BaseTree, e.repo)
	if err != nil {
		return nil, err
	}
	if _, err := checkBaseOn(ctx, be, cp.BaseTree, false); err != nil {
		return nil, err
	}
	roots := make([]rootfs.Root, 0, len(names))
	undo := func() {
		for _, r := range roots {
			r.Remove(context.WithoutCancel(ctx))
		}
	}
	sbs := make([]*delta.Sandbox, len(names))
	for i, n := range names {
		dir := e.home.sandboxDir(n)
		if i == 0 {
			if err := ensureDir(filepath.Dir(dir)); err != nil {
				return nil, err
			}
		}
		root, err := e.branchRoot(ctx, be, dir, lower, cp, o.Materialise)
		if err != nil {
			undo()
			return nil, fmt.Errorf("sandbox %s: %w", n, err)
		}
		roots = append(roots, root)
		sbs[i] = &delta.Sandbox{ID: delta.NewSandboxID(), Home: e.config.HomeID, Name: n, Backend: o.Backend, Config: cfg,
			BaseTree: cp.BaseTree, Origin: cp.ID, Created: time.Now().UTC()}
	}
	if err := e.publishSandboxes(ctx, sbs, cp.ID); err != nil {
		undo()
		return nil, err
	}
	out := make([]*RestoreResult, len(names))
	for i, n := range names {
		out[i] = &RestoreResult{Sandbox: n, Checkpoint: cp, Root: roots[i].Path()}
		if cp.ProcTree != nil && !o.FSOnly {
			if err := e.restoreProcesses(ctx, n, roots[i].Path(), img, cp); err != nil {
				return out[:i+1], fmt.Errorf("sandbox %s created with the files of %s, processes not: %w", n, cp.ID.Short(), err)
			}
			out[i].Processes = true
		}
	}
	d := time.Since(start)
	for _, r := range out {
		r.Duration = d
	}
	return out, nil
}

// publishSandboxes is publishSandbox for many sandboxes on one head: their
// objects first, then one catalog transaction for all.
func (e *Engine) publishSandboxes(ctx context.Context, sbs []*delta.Sandbox, head delta.ID) error {
	for _, sb := range sbs {
		if err := e.putSandboxObject(ctx, sb); err != nil {
			return err
		}
		if err := e.putRefObject(ctx, delta.RefHead, sb.Key(), head); err != nil {
			return err
		}
	}
	return e.cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, sb := range sbs {
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
			if err := e.queueRef(tx, sb.Name, delta.RefName(delta.RefHead, sb.Key()), head, delta.SandboxName(sb.Key())); err != nil {
				return err
			}
			if err := tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: sb.Name, Target: head}); err != nil {
				return err
			}
		}
		return nil
	})
}
