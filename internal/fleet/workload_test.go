package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// caps are what the binary under test can do, probed from its --help, so
// the workload picks up `sandbox adopt` and prune/forget --grace once they
// are merged.
type caps struct {
	adopt, pruneGrace, forgetGrace bool
}

func probeCaps(h *host) caps {
	adoptHelp := h.Help("sandbox", "adopt")
	return caps{
		// Without the subcommand, cobra prints the parent's help.
		adopt:       strings.Contains(adoptHelp, "adopt NAME") || strings.Contains(adoptHelp, "sandbox adopt"),
		pruneGrace:  strings.Contains(h.Help("prune"), "--grace"),
		forgetGrace: strings.Contains(h.Help("forget"), "--grace"),
	}
}

// worker runs one host's share of the workload, one operation at a time
// (a host's sandboxes are written by this goroutine only, so the digest
// taken before a checkpoint is the root the checkpoint sees).
type worker struct {
	t        *testing.T
	h        *host
	w        *world
	rng      *rand.Rand
	caps     caps
	calm     bool // no writes to another host's sandbox
	base     string
	created  int
	branched int
	// sinceRebuild counts operations since this host last rebuilt its
	// catalog from the bucket (how it learns the other hosts' sandboxes).
	sinceRebuild int
}

// maxSandboxes bounds what one host makes, so roots and rebuilds stay small.
const maxSandboxes = 5

const opTimeout = 2 * time.Minute

func (wk *worker) step(ctx context.Context) {
	wk.h.WaitUp(opTimeout)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	wk.w.mu.Lock()
	wk.w.steps++
	wk.w.mu.Unlock()
	wk.sinceRebuild++
	own := wk.w.writableOf(wk.h.I)
	if len(own) == 0 || (wk.created < 2 && wk.rng.IntN(10) == 0) {
		wk.create(ctx)
		return
	}
	r := wk.rng.IntN(100)
	switch {
	case r < 45:
		wk.checkpoint(ctx, own[wk.rng.IntN(len(own))])
	case r < 55:
		wk.rollback(ctx, own[wk.rng.IntN(len(own))])
	case r < 65:
		wk.branch(ctx)
	case r < 69:
		wk.adopt(ctx)
	case r < 72:
		wk.foreignWrite(ctx)
	case r < 77:
		wk.prune(ctx)
	case r < 81:
		wk.forget(ctx)
	case r < 86:
		wk.gc(ctx)
	case r < 94:
		_, err := wk.h.C.Sync(ctx, api.SyncRequest{})
		wk.count("sync", err)
	default:
		wk.rebuild(ctx)
	}
}

func (wk *worker) count(op string, err error) {
	if err != nil {
		err = fmt.Errorf("%s: %w", wk.h.Name, err)
	}
	wk.w.count(op, err)
}

func (wk *worker) logf(format string, args ...any) {
	wk.t.Logf("%s %s: %s", time.Now().UTC().Format("15:04:05.000"), wk.h.Name, fmt.Sprintf(format, args...))
}

func (wk *worker) create(ctx context.Context) {
	if wk.created >= maxSandboxes {
		if own := wk.w.writableOf(wk.h.I); len(own) > 0 {
			wk.checkpoint(ctx, own[0])
		}
		return
	}
	wk.created++
	name := fmt.Sprintf("%s-s%d", wk.h.Name, wk.created)
	start := time.Now()
	cr, err := wk.h.C.CreateSandbox(ctx, api.CreateRequest{Name: name, Base: wk.base})
	wk.count("create", err)
	if err != nil {
		// A create whose answer a kill lost may have made the sandbox
		// all the same: then its name is taken, and the next create uses
		// the next name.
		if !errors.Is(err, errdefs.ErrExists) {
			wk.created--
		}
		return
	}
	wk.w.addSandbox(name, wk.h.I, did(cr.Checkpoint), start)
}

// root mounts the sandbox (if need be) and returns its root.
func (wk *worker) root(ctx context.Context, name string) (string, error) {
	p, err := wk.h.C.SandboxPath(ctx, name)
	if err != nil {
		return "", err
	}
	return p.Root, nil
}

// checkpoint changes a few files and checkpoints, mostly waiting for the
// bucket: a checkpoint reported remote-durable must restore anywhere.
func (wk *worker) checkpoint(ctx context.Context, name string) {
	root, err := wk.root(ctx, name)
	if err != nil {
		wk.count("checkpoint", err)
		return
	}
	if err := mutate(wk.rng, root); err != nil {
		wk.t.Errorf("%s: writing into %s's root: %v", wk.h.Name, name, err)
		return
	}
	digest, err := treeDigest(root)
	if err != nil {
		wk.t.Errorf("%s: digest of %s's root: %v", wk.h.Name, name, err)
		return
	}
	wait := wk.rng.IntN(10) < 8
	start := time.Now()
	cp, err := wk.h.C.Checkpoint(ctx, name, api.CheckpointRequest{WaitRemote: wait, Message: "fleet"})
	wk.count("checkpoint", err)
	if err != nil {
		return
	}
	wk.w.checkpointed(wk.h.I, name, did(cp.ID), digest, cp.RemoteDurable, start, time.Now())
}

// rollback moves one of this host's sandboxes back to a checkpoint of it
// the test saw, and checks the root is what was checkpointed.
func (wk *worker) rollback(ctx context.Context, name string) {
	known := wk.w.knownOf(name)
	if len(known) == 0 {
		wk.checkpoint(ctx, name)
		return
	}
	c := known[wk.rng.IntN(len(known))]
	start := time.Now()
	_, err := wk.h.C.Rollback(ctx, name, api.RollbackRequest{Checkpoint: c.id.String()})
	wk.count("rollback", err)
	if err != nil {
		return
	}
	wk.w.head(name, c.id, wk.h.I, start)
	root, err := wk.root(ctx, name)
	if err != nil {
		return
	}
	if d, err := treeDigest(root); err == nil && d != c.digest {
		wk.w.problem("%s: rollback of %s to %s: the root's digest is not the one checkpointed", wk.h.Name, name, c.id.Short())
	}
}

// ensureRebuilt rebuilds this host's catalog from the bucket unless it did
// recently, so it knows the other hosts' sandboxes and checkpoints.
func (wk *worker) ensureRebuilt(ctx context.Context) bool {
	if wk.sinceRebuild < 15 {
		return true
	}
	return wk.rebuild(ctx) == nil
}

func (wk *worker) rebuild(ctx context.Context) error {
	_, err := wk.h.C.RebuildCatalog(ctx, api.RebuildRequest{})
	wk.count("rebuild", err)
	if err == nil {
		wk.sinceRebuild = 0
	}
	return err
}

// branch makes a new sandbox here from another host's durable checkpoint
// (any host's if none), and checks its root.
func (wk *worker) branch(ctx context.Context) {
	if wk.branched >= maxSandboxes {
		wk.sync(ctx)
		return
	}
	cands := wk.w.durableOf(func(c *ckptInfo) bool { return c.host != wk.h.I })
	if len(cands) == 0 {
		cands = wk.w.durableOf(func(*ckptInfo) bool { return true })
	}
	if len(cands) == 0 || !wk.ensureRebuilt(ctx) {
		return
	}
	c := cands[wk.rng.IntN(len(cands))]
	wk.branched++
	name := fmt.Sprintf("%s-b%d", wk.h.Name, wk.branched)
	start := time.Now()
	rs, err := wk.h.C.Branch(ctx, c.id.String(), api.BranchRequest{Name: name})
	wk.count("branch", err)
	if err != nil {
		if !errors.Is(err, errdefs.ErrExists) {
			wk.branched--
		}
		return
	}
	wk.w.addSandbox(name, wk.h.I, c.id, start)
	if len(rs) == 1 {
		if d, err := treeDigest(rs[0].Root); err == nil && d != c.digest {
			wk.w.problem("%s: branch %s of %s (%s's): the root's digest is not the one checkpointed", wk.h.Name, name, c.id.Short(), hostName(c.host))
		}
	}
}

func (wk *worker) sync(ctx context.Context) {
	_, err := wk.h.C.Sync(ctx, api.SyncRequest{})
	wk.count("sync", err)
}

// adopt takes over another host's sandbox (turnsnap sandbox adopt --force:
// its owner is alive); the old owner's worker goes on writing it and must
// be fenced from then on.
func (wk *worker) adopt(ctx context.Context) {
	if !wk.caps.adopt {
		wk.skip("adopt")
		wk.sync(ctx)
		return
	}
	foreign := wk.w.foreignOf(wk.h.I)
	if len(foreign) == 0 || !wk.ensureRebuilt(ctx) {
		return
	}
	name := foreign[wk.rng.IntN(len(foreign))]
	start := time.Now()
	_, err := wk.h.CLI(ctx, "sandbox", "adopt", name, "--force")
	wk.count("adopt", err)
	if err != nil {
		wk.logf("adopt %s: %v", name, err)
		return
	}
	wk.w.adopted(wk.h.I, name, start, time.Now())
	// Its root may not be on this host yet: a rollback to its head makes
	// it, as after any rebuild.
	sb, err := wk.h.C.GetSandbox(ctx, name)
	if err != nil || sb.Head == nil {
		return
	}
	rbStart := time.Now()
	if _, err := wk.h.C.Rollback(ctx, name, api.RollbackRequest{Checkpoint: sb.Head.String()}); err != nil {
		wk.logf("rollback of adopted %s to its head: %v", name, err)
		return
	}
	wk.w.head(name, did(*sb.Head), wk.h.I, rbStart)
}

// foreignWrite rolls back another host's sandbox here without adopting it
// and checkpoints it: a second writer, which the bucket must refuse.
func (wk *worker) foreignWrite(ctx context.Context) {
	if wk.calm {
		wk.sync(ctx)
		return
	}
	foreign := wk.w.foreignOf(wk.h.I)
	if len(foreign) == 0 || !wk.ensureRebuilt(ctx) {
		return
	}
	name := foreign[wk.rng.IntN(len(foreign))]
	known := wk.w.durableOf(func(c *ckptInfo) bool { return c.sandbox == name })
	if len(known) == 0 {
		return
	}
	c := known[len(known)-1]
	rbStart := time.Now()
	_, err := wk.h.C.Rollback(ctx, name, api.RollbackRequest{Checkpoint: c.id.String()})
	if err != nil {
		wk.count("foreign-write", err)
		return
	}
	wk.w.head(name, c.id, wk.h.I, rbStart)
	root, err := wk.root(ctx, name)
	if err != nil {
		wk.count("foreign-write", err)
		return
	}
	if err := mutate(wk.rng, root); err != nil {
		wk.t.Errorf("%s: writing into %s's root: %v", wk.h.Name, name, err)
		return
	}
	digest, err := treeDigest(root)
	if err != nil {
		wk.t.Errorf("%s: digest of %s's root: %v", wk.h.Name, name, err)
		return
	}
	start := time.Now()
	cp, err := wk.h.C.Checkpoint(ctx, name, api.CheckpointRequest{WaitRemote: true, Message: "fleet foreign"})
	wk.count("foreign-write", err)
	if err != nil {
		return
	}
	wk.logf("foreign write to %s accepted: checkpoint %s remote-durable", name, cp.ID.Short())
	wk.w.checkpointed(wk.h.I, name, did(cp.ID), digest, cp.RemoteDurable, start, time.Now())
}

// retention counts a prune or forget (keeping the newest keep of each
// sandbox) and keeps its span: one that failed may still have released
// checkpoints (its prune done, its gc refused; or its answer lost to a
// kill), which the bucket then loses later, when a push sends the deletes.
func (wk *worker) retention(op string, keep int, start time.Time, err error) {
	wk.count(op, err)
	wk.w.mu.Lock()
	defer wk.w.mu.Unlock()
	wk.w.retentions = append(wk.w.retentions, retentionSpan{host: wk.h.I, op: op, keep: keep, start: start, end: time.Now(), err: err})
}

func (wk *worker) skip(op string) {
	wk.w.mu.Lock()
	defer wk.w.mu.Unlock()
	wk.w.skipped[op]++
}

func (wk *worker) prune(ctx context.Context) {
	keep := 2 + wk.rng.IntN(6)
	withGC := wk.rng.IntN(3) == 0
	var pr api.Pruned
	var err error
	if wk.rng.IntN(2) == 0 {
		if !wk.caps.pruneGrace {
			wk.skip("prune --grace 0")
		} else {
			args := []string{"prune", "--keep-last", fmt.Sprint(keep), "--grace", "0"}
			if withGC {
				args = append(args, "--gc")
			}
			start := time.Now()
			err = wk.h.CLIJSON(ctx, &pr, args...)
			wk.retention("prune-grace0", keep, start, err)
			if err == nil {
				wk.w.release(releasedBy(pr.Deleted, pr.Marked)...)
			}
			return
		}
	}
	start := time.Now()
	p, err := wk.h.C.Prune(ctx, api.PruneRequest{KeepLast: keep, GC: withGC})
	wk.retention("prune", keep, start, err)
	if err == nil {
		wk.w.release(releasedBy(p.Deleted, p.Marked)...)
	}
}

// releasedBy is what a prune released: what it deleted, and what it only
// marked (a later run deletes it after the grace, without naming it
// again: a marked checkpoint is released by the run that marked it).
func releasedBy(deleted []api.ID, marked []api.RetentionEntry) []delta.ID {
	var out []delta.ID
	for _, id := range deleted {
		out = append(out, did(id))
	}
	for _, m := range marked {
		out = append(out, did(m.ID))
	}
	return out
}

// did is an ID the API returned, as the engine spells it (the zero ID
// for "").
func did(id api.ID) delta.ID {
	v, _ := delta.ParseID(string(id))
	return v
}

func (wk *worker) forget(ctx context.Context) {
	keep := 2 + wk.rng.IntN(6)
	var f *api.Forgotten
	var err error
	op := "forget"
	start := time.Now()
	if wk.rng.IntN(2) == 0 && wk.caps.forgetGrace {
		op = "forget-grace0"
		f = &api.Forgotten{}
		err = wk.h.CLIJSON(ctx, f, "forget", "--all", "--keep-last", fmt.Sprint(keep), "--grace", "0")
	} else {
		if !wk.caps.forgetGrace {
			wk.skip("forget --grace 0")
		}
		f, err = wk.h.C.Forget(ctx, api.ForgetRequest{ForgetOptions: api.ForgetOptions{All: true,
			Policy: api.RetentionPolicy{KeepLast: keep}}})
	}
	wk.retention(op, keep, start, err)
	if err != nil {
		return
	}
	var ids []delta.ID
	for _, s := range f.Sandboxes {
		for _, d := range append(s.Deleted, s.Marked...) {
			ids = append(ids, did(d.ID))
		}
	}
	wk.w.release(ids...)
}

func (wk *worker) gc(ctx context.Context) {
	req := api.GCRequest{}
	op := "gc"
	if wk.rng.IntN(2) == 0 {
		zero := int64(0)
		req.GraceMS, op = &zero, "gc-grace0"
	}
	_, err := wk.h.C.GC(ctx, req)
	wk.count(op, err)
}

// mutate makes one to four changes in root: files written (mostly small,
// some of a few hundred KiB so packs hold several chunks), removed,
// re-moded, renamed, symlinks made.
func mutate(rng *rand.Rand, root string) error {
	dirs := []string{"", "src", "src/deep", "data"}
	for range 1 + rng.IntN(4) {
		dir := filepath.Join(root, dirs[rng.IntN(len(dirs))])
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		name := filepath.Join(dir, fmt.Sprintf("f%d", rng.IntN(16)))
		switch r := rng.IntN(10); {
		case r < 6:
			size := rng.IntN(4 << 10)
			if rng.IntN(6) == 0 {
				size = 64<<10 + rng.IntN(448<<10)
			}
			b := make([]byte, size)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			if err := os.WriteFile(name, b, 0o644); err != nil {
				return err
			}
		case r < 7:
			if err := os.Remove(name); err != nil && !os.IsNotExist(err) {
				return err
			}
		case r < 8:
			if err := os.Chmod(name, []os.FileMode{0o600, 0o644, 0o755}[rng.IntN(3)]); err != nil && !os.IsNotExist(err) {
				return err
			}
		case r < 9:
			to := filepath.Join(dir, fmt.Sprintf("f%d", rng.IntN(16)))
			if err := os.Rename(name, to); err != nil && !os.IsNotExist(err) {
				return err
			}
		default:
			link := filepath.Join(dir, fmt.Sprintf("l%d", rng.IntN(4)))
			os.Remove(link)
			if err := os.Symlink(fmt.Sprintf("f%d", rng.IntN(16)), link); err != nil {
				return err
			}
		}
	}
	return nil
}
