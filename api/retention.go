package api

import "time"

// PolicyView is what ShowPolicies reports.
//
// The wire form of engine.PolicyView.
type PolicyView struct {
	Home      *RetentionPolicy `json:"home"`
	Sandboxes []SandboxPolicy  `json:"sandboxes"`
}

// PolicyOptions names what SetPolicy and ClearPolicy change: a sandbox's
// policy, or the home's when Sandbox is empty.
//
// The wire form of engine.PolicyOptions.
type PolicyOptions struct {
	Sandbox string          `json:"sandbox,omitempty"`
	Policy  RetentionPolicy `json:"policy"` // SetPolicy only
}

// ForgetOptions configures Forget.
//
// The wire form of engine.ForgetOptions.
type ForgetOptions struct {
	// Sandbox names the one sandbox to apply the policy to; All applies
	// it to every sandbox this home may prune (including removed ones
	// whose checkpoints remain). Exactly one of the two is set.
	Sandbox string          `json:"sandbox,omitempty"`
	All     bool            `json:"all,omitempty"`
	Policy  RetentionPolicy `json:"policy"`
	DryRun  bool            `json:"dry_run,omitempty"`
}

// ForgetReport lists, per sandbox, what a policy kept and deleted.
//
// The wire form of engine.ForgetReport.
type ForgetReport struct {
	DryRun             bool            `json:"dry_run"`
	Sandboxes          []ForgetSandbox `json:"sandboxes"`
	CheckpointsKept    int             `json:"checkpoints_kept"`
	CheckpointsDeleted int             `json:"checkpoints_deleted"`
	CheckpointsMarked  int             `json:"checkpoints_marked"`
	// Swept are checkpoints an earlier run marked, of sandboxes this run
	// did not decide for, deleted now that their grace is over.
	Swept []RetentionEntry `json:"swept"`
}

// RetentionEntry is one checkpoint a policy kept or would delete, and why.
//
// The wire form of engine.RetentionEntry.
type RetentionEntry struct {
	ID      ID        `json:"id"`
	Sandbox string    `json:"sandbox"`
	Turn    int       `json:"turn"`
	Created time.Time `json:"created"`
	// Reasons say which rules keep it ("last 3", "daily 2026-12-01", "head",
	// "tag known-good", "branched: b"); empty for a deleted one.
	Reasons []string `json:"reasons,omitempty"`
	// DeleteAfter is set on a checkpoint marked for deletion and not
	// deleted yet (a shared bucket's two-phase retention): a prune,
	// forget or gc after it deletes the record unless a ref names it.
	DeleteAfter time.Time `json:"delete_after,omitzero"`
}

// RetentionPolicy says which checkpoints of a sandbox to keep, in the style
// of restic's forget policy: a checkpoint is kept when any rule keeps it.
// Heads, tagged checkpoints and checkpoints another sandbox was branched
// from are kept whatever the policy says.
//
// The wire form of engine.RetentionPolicy.
type RetentionPolicy struct {
	// KeepLast keeps the newest N checkpoints.
	KeepLast int `json:"keep_last,omitempty"`
	// KeepWithin keeps every checkpoint taken within this span before the
	// sandbox's newest checkpoint (as restic does: relative to the newest,
	// not to now, so a sandbox left alone for a month keeps its last turns).
	// A Go duration or a number of days or weeks: "36h", "7d", "2w".
	KeepWithin string `json:"keep_within,omitempty"`
	// KeepHourly ... KeepMonthly keep the newest checkpoint of each of the
	// last N hours, days, ISO weeks and months (UTC) that have one.
	KeepHourly  int `json:"keep_hourly,omitempty"`
	KeepDaily   int `json:"keep_daily,omitempty"`
	KeepWeekly  int `json:"keep_weekly,omitempty"`
	KeepMonthly int `json:"keep_monthly,omitempty"`
	// KeepTags keeps checkpoints with a tag matching one of these
	// patterns (path.Match: "release-*"). Every tagged checkpoint is kept
	// anyway; a pattern makes the reason show in the report.
	KeepTags []string `json:"keep_tags,omitempty"`
}

// SandboxPolicy is the policy that applies to one sandbox and where it
// comes from: "sandbox" (its own), "home", or "none".
//
// The wire form of engine.SandboxPolicy.
type SandboxPolicy struct {
	Sandbox string           `json:"sandbox"`
	Policy  *RetentionPolicy `json:"policy"`
	Source  string           `json:"source"`
}

// ForgetSandbox is one sandbox's part of a ForgetReport, newest first.
//
// The wire form of engine.ForgetSandbox.
type ForgetSandbox struct {
	Sandbox string           `json:"sandbox"`
	Policy  RetentionPolicy  `json:"policy"`
	Kept    []RetentionEntry `json:"kept"`
	Deleted []RetentionEntry `json:"deleted"`
	// Marked are dropped checkpoints marked for deletion, not deleted yet
	// (each with its DeleteAfter); see PruneReport.Marked.
	Marked []RetentionEntry `json:"marked"`
}

// ForgetRequest is POST /v1/forget: engine.ForgetOptions, and GC to run
// gc afterwards.
type ForgetRequest struct {
	ForgetOptions
	GC bool `json:"gc,omitempty"`
	// GraceMS: with a remote, how long dropped records stay marked before
	// a later run deletes them; absent: engine.DefaultRecordGrace, 0: this
	// run sweeps them.
	GraceMS *int64 `json:"grace_ms,omitempty"`
}

// ApplyPoliciesRequest is POST /v1/policies/apply.
type ApplyPoliciesRequest struct {
	GC      bool   `json:"gc,omitempty"`
	GraceMS *int64 `json:"grace_ms,omitempty"` // as ForgetRequest's
}

// Forgotten is what forget and policy apply did: the engine's report and,
// with GC, the gc that followed (null otherwise).
type Forgotten struct {
	ForgetReport
	GC *GCReport `json:"gc"`
}

// MaxRestorePaths bounds one restore request's paths.
const MaxRestorePaths = 4096

// IsZero says the policy has no rule.
func (p RetentionPolicy) IsZero() bool {
	return p.KeepLast == 0 && p.KeepWithin == "" && p.KeepHourly == 0 && p.KeepDaily == 0 &&
		p.KeepWeekly == 0 && p.KeepMonthly == 0 && len(p.KeepTags) == 0
}
