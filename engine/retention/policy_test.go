package retention

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// fakeHistory makes checkpoints at the given times (newest last), ids
// from their index.
func fakeHistory(times ...time.Time) []*delta.Checkpoint {
	var out []*delta.Checkpoint
	for i, t := range times {
		out = append(out, &delta.Checkpoint{ID: delta.Hash([]byte(fmt.Sprint(i))), Turn: i, Created: t})
	}
	return out
}

func keptTurns(keep []Entry) []int {
	var out []int
	for _, k := range keep {
		out = append(out, k.Turn)
	}
	slices.Sort(out)
	return out
}

// The bucket rules keep the newest checkpoint of each of the last N
// buckets that have one; any rule keeps; pins always keep.
func TestApplyPolicyRules(t *testing.T) {
	d := func(day, hour int) time.Time { return time.Date(2026, 11, day, hour, 30, 0, 0, time.UTC) }
	// Turns 0..7: Nov 2 10:30, Nov 2 11:30, Nov 2 11:45 (same hour), Nov 3 09:30,
	// Nov 9 09:30 (next ISO week), Nov 16, Nov 30, Nov 30 +1h.
	cps := fakeHistory(d(2, 10), d(2, 11), d(2, 11).Add(15*time.Minute), d(3, 9), d(9, 9), d(16, 9), d(30, 9), d(30, 10))
	for _, tc := range []struct {
		name string
		p    Policy
		want []int
	}{
		{"last", Policy{KeepLast: 2}, []int{6, 7}},
		{"hourly", Policy{KeepHourly: 3}, []int{5, 6, 7}},
		{"daily", Policy{KeepDaily: 4}, []int{3, 4, 5, 7}},
		{"weekly", Policy{KeepWeekly: 3}, []int{4, 5, 7}},
		{"monthly", Policy{KeepMonthly: 5}, []int{7}},
		{"within", Policy{KeepWithin: "14d"}, []int{6, 7}}, // Nov 16 09:30 is 14d1h before the newest
		{"within more", Policy{KeepWithin: "15d"}, []int{5, 6, 7}},
		{"within hours", Policy{KeepWithin: "90m"}, []int{6, 7}},
		{"union", Policy{KeepLast: 1, KeepWeekly: 2}, []int{5, 7}},
	} {
		keep, drop := applyPolicy(tc.p, cps, Pins{}, nil, "s")
		if got := keptTurns(keep); !slices.Equal(got, tc.want) {
			t.Errorf("%s: kept turns %v, want %v", tc.name, got, tc.want)
		}
		if len(keep)+len(drop) != len(cps) {
			t.Errorf("%s: %d kept + %d dropped of %d", tc.name, len(keep), len(drop), len(cps))
		}
	}
	// Nov 2 has turns 0, 1, 2: daily keeps 2 (the newest of the day), never 0 or 1.
	keep, _ := applyPolicy(Policy{KeepDaily: 100}, cps, Pins{}, nil, "s")
	if got := keptTurns(keep); !slices.Equal(got, []int{2, 3, 4, 5, 7}) {
		t.Fatalf("daily 100: %v", got)
	}
	pin := Pins{}
	pin.Add(cps[0].ID, "head of s")
	tags := map[delta.ID][]string{cps[1].ID: {"release-1"}}
	keep, _ = applyPolicy(Policy{KeepLast: 1, KeepTags: []string{"release-*"}}, cps, pin, tags, "s")
	if got := keptTurns(keep); !slices.Equal(got, []int{0, 1, 7}) {
		t.Fatalf("pins and tags: kept %v, want [0 1 7]", got)
	}
	for _, k := range keep {
		if k.Turn == 0 && !slices.Equal(k.Reasons, []string{"head of s"}) {
			t.Fatalf("pinned reasons %v", k.Reasons)
		}
	}
}

func TestRetentionPolicyValidate(t *testing.T) {
	for _, p := range []Policy{
		{KeepLast: -1}, {KeepDaily: maxKeep + 1}, {KeepWithin: "0h"}, {KeepWithin: "-3h"}, {KeepWithin: "7x"},
		{KeepWithin: "d"}, {KeepWithin: "99999999d"}, {KeepTags: []string{"["}}, {KeepTags: []string{""}},
	} {
		if err := p.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", p, err)
		}
	}
	for s, want := range map[string]time.Duration{"36h": 36 * time.Hour, "7d": 7 * 24 * time.Hour, "2w": 14 * 24 * time.Hour, "90m": 90 * time.Minute} {
		if got, err := ParseWithin(s); err != nil || got != want {
			t.Errorf("ParseWithin(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
}

// FuzzDecodePolicies: HOME/retention.json is decoded strictly and bounded;
// whatever it accepts re-encodes and decodes to the same policies.
func FuzzDecodePolicies(f *testing.F) {
	f.Add([]byte(`{"version":1,"home":{"keep_last":3,"keep_within":"7d"},"sandboxes":{"agent":{"keep_daily":7,"keep_tags":["rel-*"]}}}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"sandboxes":{"../x":{"keep_last":1}}}`))
	f.Add([]byte(`{"version":1,"home":{"keep_last":-1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodePolicies(data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error without the corrupt class: %v", err)
			}
			return
		}
		if p.Home != nil {
			if err := p.Home.Validate(); err != nil {
				t.Fatalf("accepted an invalid home policy: %v", err)
			}
		}
		for k, rp := range p.Sandboxes {
			if err := rp.Validate(); err != nil || (!delta.ValidRefName(k) && !delta.ValidSandboxID(k)) {
				t.Fatalf("accepted sandbox %q policy %+v: %v", k, rp, err)
			}
		}
	})
}
