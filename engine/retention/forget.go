package retention

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// ForgetOptions configures Forget.
type ForgetOptions struct {
	// Sandbox names the one sandbox to apply the policy to; All applies
	// it to every sandbox this home may prune (including removed ones
	// whose checkpoints remain). Exactly one of the two is set.
	Sandbox string `json:"sandbox,omitempty"`
	All     bool   `json:"all,omitempty"`
	Policy  Policy `json:"policy"`
	DryRun  bool   `json:"dry_run,omitempty"`
	// Grace is as PruneOptions.Grace: with a remote, how long dropped
	// records stay marked before a later run may delete them; 0 sweeps in
	// this run. The API carries it as grace_ms (absent: DefaultRecordGrace).
	Grace time.Duration `json:"-"`
}

// ForgetReport lists, per sandbox, what a policy kept and deleted.
type ForgetReport struct {
	DryRun             bool            `json:"dry_run"`
	Sandboxes          []ForgetSandbox `json:"sandboxes"`
	CheckpointsKept    int             `json:"checkpoints_kept"`
	CheckpointsDeleted int             `json:"checkpoints_deleted"`
	CheckpointsMarked  int             `json:"checkpoints_marked"`
	// Swept are checkpoints an earlier run marked, of sandboxes this run
	// did not decide for, deleted now that their grace is over.
	Swept []Entry `json:"swept"`
}

// ForgetSandbox is one sandbox's part of a ForgetReport, newest first.
type ForgetSandbox struct {
	Sandbox string  `json:"sandbox"`
	Policy  Policy  `json:"policy"`
	Kept    []Entry `json:"kept"`
	Deleted []Entry `json:"deleted"`
	// Marked are dropped checkpoints marked for deletion, not deleted yet
	// (each with its DeleteAfter); see PruneReport.Marked.
	Marked []Entry `json:"marked"`
}

// Forget deletes the checkpoints a retention policy does not keep (restic's
// forget): a checkpoint stays when any rule keeps it, and heads, tagged
// checkpoints and checkpoints another sandbox continues from always stay.
// Deleting works as Prune's does (records everywhere, then the catalog and
// refcounts); run gc afterwards to reclaim the packs.
func (rt *Retention) Forget(ctx context.Context, opts ForgetOptions) (*ForgetReport, error) {
	if (opts.Sandbox == "") == !opts.All {
		return nil, fmt.Errorf("forget: name one sandbox or --all: %w", errdefs.ErrInvalid)
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	if opts.Policy.IsZero() {
		return nil, fmt.Errorf("forget: no --keep-* rule given, so nothing would be kept but heads, tags and branch points; give at least one: %w", errdefs.ErrInvalid)
	}
	defer rt.d.Exclusive()()
	o := rt.op()
	h, err := o.d.LoadHistory(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.addBucketPins(ctx, h); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	plan := map[string]Policy{}
	if opts.All {
		for key := range h.BySandbox {
			if h.mayPrune(key) {
				plan[key] = opts.Policy
			}
		}
	} else {
		key, err := h.ownedKey(opts.Sandbox)
		if err != nil {
			return nil, err
		}
		plan[key] = opts.Policy
	}
	return o.forget(ctx, h, plan, opts.Grace, opts.DryRun)
}

// ownedKey is the key of the live sandbox name, if this home may prune it.
func (h *History) ownedKey(name string) (string, error) {
	key, ok := h.Keys[name]
	if !ok {
		if !delta.ValidRefName(name) {
			return "", fmt.Errorf("sandbox %q: name is not valid: %w", name, errdefs.ErrInvalid)
		}
		return "", fmt.Errorf("sandbox %s: %w", name, errdefs.ErrNotFound)
	}
	if !h.mayPrune(key) {
		return "", fmt.Errorf("sandbox %s was created by another home sharing the bucket; only that home deletes its checkpoints: %w",
			name, errdefs.ErrPrecondition)
	}
	return key, nil
}

// forget applies plan (sandbox key -> policy) with the engine's exclusive
// lock held; h holds the bucket's pins.
func (o *op) forget(ctx context.Context, h *History, plan map[string]Policy, grace time.Duration, dryRun bool) (*ForgetReport, error) {
	rep := &ForgetReport{DryRun: dryRun, Sandboxes: []ForgetSandbox{}, Swept: []Entry{}}
	var drop []*delta.Checkpoint
	byID := map[delta.ID]*delta.Checkpoint{}
	covered := map[string]bool{}
	for key := range plan {
		covered[key] = true
		for _, cp := range h.BySandbox[key] {
			byID[cp.ID] = cp
		}
	}
	var parts []forgetPart
	for key, p := range plan {
		cps := h.BySandbox[key]
		if len(cps) == 0 {
			continue
		}
		keep, del := applyPolicy(p, cps, h.Pin, h.Tags, h.label(cps[0]))
		parts = append(parts, forgetPart{h.label(cps[0]), p, keep, del})
		for _, d := range del {
			drop = append(drop, byID[d.ID])
		}
	}
	r, err := o.retire(ctx, h, drop, covered, grace, dryRun)
	if r == nil {
		return rep, err
	}
	r.report(rep, h, parts)
	return rep, err
}

// forgetPart is one sandbox's decision in a forget run: what its policy
// keeps and what it drops.
type forgetPart struct {
	sandbox string // its label
	policy  Policy
	keep    []Entry
	dropped []Entry
}

// report fills rep from what retire did: per part, its dropped entries
// deleted, marked, or kept after all (the mark object full); then the
// records swept of earlier runs' marks.
func (r *retired) report(rep *ForgetReport, h *History, parts []forgetPart) {
	for _, pt := range parts {
		s := ForgetSandbox{Sandbox: pt.sandbox, Policy: pt.policy, Kept: pt.keep}
		for _, d := range pt.dropped {
			switch due, marked := r.marked[d.ID]; {
			case r.deleted[d.ID]:
				s.Deleted = append(s.Deleted, d)
			case marked:
				d.DeleteAfter = due
				s.Marked = append(s.Marked, d)
			default:
				d.Reasons = []string{"left for a later run"} // the mark object is full
				s.Kept = append(s.Kept, d)
			}
		}
		s.Kept, s.Deleted, s.Marked = orNone(s.Kept), orNone(s.Deleted), orNone(s.Marked)
		rep.CheckpointsKept += len(s.Kept)
		rep.CheckpointsDeleted += len(s.Deleted)
		rep.CheckpointsMarked += len(s.Marked)
		rep.Sandboxes = append(rep.Sandboxes, s)
	}
	for _, cp := range r.swept {
		rep.Swept = append(rep.Swept, Entry{ID: cp.ID, Sandbox: h.label(cp), Turn: cp.Turn, Created: cp.Created})
		rep.CheckpointsDeleted++
	}
	slices.SortFunc(rep.Sandboxes, func(a, b ForgetSandbox) int { return cmp.Compare(a.Sandbox, b.Sandbox) })
}

func orNone(l []Entry) []Entry {
	if l == nil {
		return []Entry{}
	}
	return l
}

// ApplyPolicies carries out the stored retention policies (SetPolicy):
// every live sandbox this home may prune is forgotten by its own policy,
// or the home's if it has none; a sandbox with neither is left alone. The
// daemon calls it on a schedule; it holds the engine's exclusive lock for
// its run, as Prune does.
//
// With a remote, dropped records are marked for grace before a later run
// deletes them (see Forget); the daemon passes DefaultRecordGrace.
func (rt *Retention) ApplyPolicies(ctx context.Context, grace time.Duration) (*ForgetReport, error) {
	defer rt.d.Exclusive()()
	o := rt.op()
	pol, err := rt.loadPolicies()
	if err != nil {
		return nil, err
	}
	h, err := o.d.LoadHistory(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.addBucketPins(ctx, h); err != nil {
		return nil, fmt.Errorf("policy apply: %w", err)
	}
	plan := map[string]Policy{}
	for _, key := range h.Keys {
		if !h.mayPrune(key) {
			continue
		}
		if p, ok := pol.Sandboxes[key]; ok {
			plan[key] = p
		} else if pol.Home != nil && !pol.Home.IsZero() {
			plan[key] = *pol.Home
		}
	}
	return o.forget(ctx, h, plan, grace, false)
}

// PolicyOptions names what SetPolicy and ClearPolicy change: a sandbox's
// policy, or the home's when Sandbox is empty.
type PolicyOptions struct {
	Sandbox string `json:"sandbox,omitempty"`
	Policy  Policy `json:"policy"` // SetPolicy only
}

// PolicyView is what ShowPolicies reports.
type PolicyView struct {
	Home      *Policy         `json:"home"`
	Sandboxes []SandboxPolicy `json:"sandboxes"`
}

// SandboxPolicy is the policy that applies to one sandbox and where it
// comes from: "sandbox" (its own), "home", or "none".
type SandboxPolicy struct {
	Sandbox string  `json:"sandbox"`
	Policy  *Policy `json:"policy"`
	Source  string  `json:"source"`
}

// SetPolicy stores a retention policy for a sandbox or the home, replacing
// the one it had. ApplyPolicies carries it out.
func (rt *Retention) SetPolicy(ctx context.Context, opts PolicyOptions) error {
	if err := opts.Policy.Validate(); err != nil {
		return err
	}
	if opts.Policy.IsZero() {
		return fmt.Errorf("policy set: no --keep-* rule given (use `policy clear` to remove a policy): %w", errdefs.ErrInvalid)
	}
	return rt.editPolicies(ctx, opts.Sandbox, func(p *Policies, key string) {
		if key == "" {
			rp := opts.Policy
			p.Home = &rp
			return
		}
		if p.Sandboxes == nil {
			p.Sandboxes = map[string]Policy{}
		}
		p.Sandboxes[key] = opts.Policy
	})
}

// ClearPolicy removes a sandbox's policy (it then follows the home's) or
// the home's.
func (rt *Retention) ClearPolicy(ctx context.Context, opts PolicyOptions) error {
	return rt.editPolicies(ctx, opts.Sandbox, func(p *Policies, key string) {
		if key == "" {
			p.Home = nil
		} else {
			delete(p.Sandboxes, key)
		}
	})
}

func (rt *Retention) editPolicies(ctx context.Context, sandbox string, edit func(*Policies, string)) error {
	defer rt.d.Exclusive()()
	key := ""
	if sandbox != "" {
		h, err := rt.d.LoadHistory(ctx)
		if err != nil {
			return err
		}
		if key, err = h.ownedKey(sandbox); err != nil {
			return err
		}
	}
	p, err := rt.loadPolicies()
	if err != nil {
		return err
	}
	edit(p, key)
	return rt.savePolicies(p)
}

// ShowPolicies reports the home's policy and, for each live sandbox (or the
// one named), the policy that applies to it.
func (rt *Retention) ShowPolicies(ctx context.Context, sandbox string) (*PolicyView, error) {
	defer rt.d.Shared()()
	p, err := rt.loadPolicies()
	if err != nil {
		return nil, err
	}
	h, err := rt.d.LoadHistory(ctx)
	if err != nil {
		return nil, err
	}
	v := &PolicyView{Home: p.Home, Sandboxes: []SandboxPolicy{}}
	names := make([]string, 0, len(h.Keys))
	for n := range h.Keys {
		names = append(names, n)
	}
	if sandbox != "" {
		if _, ok := h.Keys[sandbox]; !ok {
			return nil, fmt.Errorf("sandbox %s: %w", sandbox, errdefs.ErrNotFound)
		}
		names = []string{sandbox}
	}
	slices.Sort(names)
	for _, n := range names {
		sp := SandboxPolicy{Sandbox: n, Source: "none"}
		if rp, ok := p.Sandboxes[h.Keys[n]]; ok {
			sp.Policy, sp.Source = &rp, "sandbox"
		} else if p.Home != nil {
			sp.Policy, sp.Source = p.Home, "home"
		}
		v.Sandboxes = append(v.Sandboxes, sp)
	}
	return v, nil
}
