package retention

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Policy says which checkpoints of a sandbox to keep, in the style
// of restic's forget policy: a checkpoint is kept when any rule keeps it.
// Heads, tagged checkpoints and checkpoints another sandbox was branched
// from are kept whatever the policy says.
type Policy struct {
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

// maxKeep bounds every count of a policy: a larger number would be a typo,
// and bounds keep a stored policy harmless.
const maxKeep = 1 << 20

// IsZero reports whether the policy has no rule (and so would keep only
// what is always kept: Forget refuses it, as restic does).
func (p Policy) IsZero() bool {
	return p.KeepLast == 0 && p.KeepWithin == "" && p.KeepHourly == 0 && p.KeepDaily == 0 &&
		p.KeepWeekly == 0 && p.KeepMonthly == 0 && len(p.KeepTags) == 0
}

// Validate checks every field.
func (p Policy) Validate() error {
	for _, n := range []struct {
		name string
		v    int
	}{{"keep-last", p.KeepLast}, {"keep-hourly", p.KeepHourly}, {"keep-daily", p.KeepDaily},
		{"keep-weekly", p.KeepWeekly}, {"keep-monthly", p.KeepMonthly}} {
		if n.v < 0 || n.v > maxKeep {
			return fmt.Errorf("retention policy: --%s %d is not in 0..%d: %w", n.name, n.v, maxKeep, errdefs.ErrInvalid)
		}
	}
	if p.KeepWithin != "" {
		if _, err := ParseWithin(p.KeepWithin); err != nil {
			return err
		}
	}
	if len(p.KeepTags) > 64 {
		return fmt.Errorf("retention policy: %d tag patterns, at most 64: %w", len(p.KeepTags), errdefs.ErrInvalid)
	}
	for _, t := range p.KeepTags {
		if _, err := path.Match(t, ""); err != nil || t == "" || len(t) > delta.MaxNameLen {
			return fmt.Errorf("retention policy: tag pattern %q is not valid: %w", t, errdefs.ErrInvalid)
		}
	}
	return nil
}

// ParseWithin reads a --keep-within span: a Go duration ("36h", "90m") or
// a whole number of days or weeks ("7d", "2w"). It must be positive.
func ParseWithin(s string) (time.Duration, error) {
	bad := fmt.Errorf("retention policy: --keep-within %q: want a duration such as 36h, 7d or 2w: %w", s, errdefs.ErrInvalid)
	var d time.Duration
	if n, unit := strings.TrimRight(s, "dw"), strings.TrimLeft(s, "0123456789"); unit == "d" || unit == "w" {
		v, err := strconv.Atoi(n)
		if err != nil || v <= 0 || v > 100*366 {
			return 0, bad
		}
		d = time.Duration(v) * 24 * time.Hour
		if unit == "w" {
			d *= 7
		}
		return d, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, bad
	}
	return d, nil
}

// Entry is one checkpoint a policy kept or would delete, and why.
type Entry struct {
	ID      delta.ID  `json:"id"`
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

// Pins is what no policy may delete, with the reason: heads, tags and
// the checkpoints other sandboxes continue from.
type Pins map[delta.ID][]string

// Add pins id for why (once).
func (p Pins) Add(id delta.ID, why string) {
	if !slices.Contains(p[id], why) {
		p[id] = append(p[id], why)
	}
}

// applyPolicy splits one sandbox's checkpoints into kept and deleted,
// newest first. tagsOf gives the tags naming a checkpoint.
func applyPolicy(p Policy, cps []*delta.Checkpoint, pin Pins, tagsOf map[delta.ID][]string, label string) (keep, drop []Entry) {
	cps = slices.Clone(cps)
	slices.SortFunc(cps, func(a, b *delta.Checkpoint) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID.String(), b.ID.String())
	})
	var within time.Duration
	if p.KeepWithin != "" {
		within, _ = ParseWithin(p.KeepWithin) // validated
	}
	type bucket struct {
		name   string
		n      int
		key    func(time.Time) string
		seen   map[string]bool
		filled int
	}
	buckets := []*bucket{
		{name: "hourly", n: p.KeepHourly, key: func(t time.Time) string { return t.Format("2006-01-02T15h") }},
		{name: "daily", n: p.KeepDaily, key: func(t time.Time) string { return t.Format("2006-01-02") }},
		{name: "weekly", n: p.KeepWeekly, key: func(t time.Time) string {
			y, w := t.ISOWeek()
			return fmt.Sprintf("%d-W%02d", y, w)
		}},
		{name: "monthly", n: p.KeepMonthly, key: func(t time.Time) string { return t.Format("2006-01") }},
	}
	for _, b := range buckets {
		b.seen = map[string]bool{}
	}
	for i, cp := range cps {
		e := Entry{ID: cp.ID, Sandbox: label, Turn: cp.Turn, Created: cp.Created}
		if i < p.KeepLast {
			e.Reasons = append(e.Reasons, fmt.Sprintf("last %d", p.KeepLast))
		}
		if within > 0 && cps[0].Created.Sub(cp.Created) <= within {
			e.Reasons = append(e.Reasons, "within "+p.KeepWithin)
		}
		t := cp.Created.UTC()
		for _, b := range buckets {
			k := b.key(t)
			// The newest checkpoint of each bucket, for the newest n
			// buckets that hold one (restic's rule).
			if b.filled < b.n && !b.seen[k] {
				b.seen[k] = true
				b.filled++
				e.Reasons = append(e.Reasons, b.name+" "+k)
			}
		}
		for _, tag := range tagsOf[cp.ID] {
			for _, pat := range p.KeepTags {
				if ok, _ := path.Match(pat, tag); ok {
					e.Reasons = append(e.Reasons, "tag "+tag)
					break
				}
			}
		}
		for _, why := range pin[cp.ID] {
			if !slices.Contains(e.Reasons, why) {
				e.Reasons = append(e.Reasons, why)
			}
		}
		if len(e.Reasons) > 0 {
			keep = append(keep, e)
		} else {
			drop = append(drop, e)
		}
	}
	return keep, drop
}
