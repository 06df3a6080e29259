package catalog

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// HEAD, HEAD~N and NAME@HEAD~N: relative to the sandbox in context, or the
// named one; ~N walks first parents, across a branch point into the
// origin's history, and stops with ErrNotFound at the first checkpoint or
// at a pruned one, naming where it stopped. Malformed forms are ErrInvalid.
func TestResolveCheckpointHead(t *testing.T) {
	c := openTest(t)
	// s: s0 <- s1 <- s2 <- s3 (head); b branched from s1: b0 (head).
	var s []delta.ID
	parent := delta.ID{}
	for turn := range 4 {
		parent = put(t, c, testRecord("s", parent, turn, t0))
		s = append(s, parent)
	}
	b0 := put(t, c, testRecord("b", s[1], 100, t0))
	update(t, c, func(tx *Tx) error {
		for _, r := range []delta.Ref{{Kind: delta.RefHead, Name: "s", Target: s[3]}, {Kind: delta.RefHead, Name: "b", Target: b0},
			{Kind: delta.RefTag, Name: "v1", Target: s[2]}} {
			if err := tx.SetRef(r); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, c, func(tx *Tx) error {
		for _, tc := range []struct {
			sandbox, ref string
			want         delta.ID
		}{
			{"s", "HEAD", s[3]}, {"s", "HEAD~0", s[3]}, {"s", "HEAD~1", s[2]}, {"s", "HEAD~", s[2]}, {"s", "HEAD~3", s[0]},
			{"s", "HEAD~1~2", s[0]}, {"b", "HEAD", b0}, {"b", "HEAD~1", s[1]}, {"b", "HEAD~2", s[0]},
			{"", "s@HEAD", s[3]}, {"", "s@HEAD~2", s[1]}, {"b", "s@HEAD~2", s[1]}, {"s", "b@HEAD~1", s[1]},
			{"", "v1~1", s[1]}, {"", s[3].String()[:8] + "~3", s[0]}, {"b", "v1", s[2]},
		} {
			got, err := resolveText(tx, delta.SandboxName(tc.sandbox), tc.ref)
			if err != nil || got != tc.want {
				t.Errorf("resolve %q for %q: %s %v, want %s", tc.ref, tc.sandbox, got.Short(), err, tc.want.Short())
			}
		}
		for _, tc := range []struct {
			sandbox, ref string
			want         error
			says         string
		}{
			{"", "HEAD", errdefs.ErrInvalid, "write NAME@HEAD"},
			{"", "HEAD~1", errdefs.ErrInvalid, "write NAME@HEAD"},
			{"s", "HEAD~4", errdefs.ErrNotFound, "stopped 3 back at " + s[0].Short() + " (s turn 0), which has no parent"},
			{"s", "HEAD~10000", errdefs.ErrNotFound, "no parent"},
			{"s", "HEAD~10001", errdefs.ErrInvalid, "more than 10000"},
			{"s", "HEAD~5000~5001", errdefs.ErrInvalid, "more than 10000"},
			{"s", "HEAD~99999999999999999999", errdefs.ErrInvalid, "not ~N"},
			{"s", "HEAD~-1", errdefs.ErrInvalid, "not ~N"},
			{"s", "HEAD~x", errdefs.ErrInvalid, "not ~N"},
			{"s", "HEAD~+1", errdefs.ErrInvalid, "not ~N"},
			{"s", "~1", errdefs.ErrInvalid, "follows nothing"},
			{"s", "s@", errdefs.ErrInvalid, "only NAME@HEAD"},
			{"s", "s@v1", errdefs.ErrInvalid, "only NAME@HEAD"},
			{"s", "s@head", errdefs.ErrInvalid, "only NAME@HEAD"},
			{"s", "@HEAD", errdefs.ErrInvalid, "not a sandbox name"},
			{"s", "a@b@HEAD", errdefs.ErrInvalid, "only NAME@HEAD"},
			{"s", "nosuch@HEAD", errdefs.ErrNotFound, "no sandbox nosuch"},
			{"nosuch", "HEAD", errdefs.ErrNotFound, "no sandbox nosuch"},
			{"s", "nope~1", errdefs.ErrNotFound, "no checkpoint or tag"},
		} {
			_, err := resolveText(tx, delta.SandboxName(tc.sandbox), tc.ref)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("resolve %q for %q: %v, want %v saying %q", tc.ref, tc.sandbox, err, tc.want, tc.says)
			}
		}
		return nil
	})
	// Prune s1: a walk through it stops at s2, naming it and the gap.
	update(t, c, func(tx *Tx) error { return tx.DeleteCheckpoint(s[1]) })
	view(t, c, func(tx *Tx) error {
		if got, err := resolveText(tx, "s", "HEAD~1"); err != nil || got != s[2] {
			t.Errorf("HEAD~1 above the pruned checkpoint: %s %v", got.Short(), err)
		}
		_, err := resolveText(tx, "s", "HEAD~2")
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "stopped 1 back at "+s[2].Short()) ||
			!strings.Contains(err.Error(), s[1].Short()+" is gone (pruned)") {
			t.Errorf("walk past a pruned checkpoint: %v", err)
		}
		return nil
	})
}
