package catalog

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// collidingRecords finds two records whose IDs share their first 4 hex
// digits, by encoding (not storing) records until two collide; the records
// are deterministic, so so is the pair.
func collidingRecords(t *testing.T) (a, b *delta.Checkpoint) {
	seen := make(map[string]*delta.Checkpoint)
	for turn := 0; turn < 100000; turn++ {
		cp := testRecord("s", delta.ID{}, turn, t0)
		_, id, err := delta.EncodeRecord(cp)
		if err != nil {
			t.Fatal(err)
		}
		p := id.String()[:4]
		if prev, ok := seen[p]; ok {
			return prev, cp
		}
		seen[p] = cp
	}
	t.Fatal("no 4-digit collision")
	return nil, nil
}

func TestResolveCheckpoint(t *testing.T) {
	c := openTest(t)
	a, b := collidingRecords(t)
	idA, idB := put(t, c, a), put(t, c, b)
	other := put(t, c, testRecord("s", delta.ID{}, 200000, t0))
	update(t, c, func(tx *Tx) error {
		if err := tx.SetRef(delta.Ref{Kind: delta.RefTag, Name: "v1", Target: other}); err != nil {
			return err
		}
		// A hex-looking tag that matches no checkpoint prefix.
		return tx.SetRef(delta.Ref{Kind: delta.RefTag, Name: "ffffffff", Target: idA})
	})
	if strings.HasPrefix(idA.String(), "ffffffff") || strings.HasPrefix(idB.String(), "ffffffff") || strings.HasPrefix(other.String(), "ffffffff") {
		t.Skip("unlucky IDs")
	}
	unique := func(id delta.ID) string {
		// Shortest prefix (>= 4, odd lengths included) matching only id.
		for n := 4; n < 64; n++ {
			p := id.String()[:n]
			hits := 0
			for _, x := range []delta.ID{idA, idB, other} {
				if strings.HasPrefix(x.String(), p) {
					hits++
				}
			}
			if hits == 1 {
				return p
			}
		}
		return id.String()
	}
	view(t, c, func(tx *Tx) error {
		for s, want := range map[string]delta.ID{
			idA.String():                      idA,
			strings.ToUpper(idB.String()):     idB,
			unique(idA):                       idA,
			unique(idB):                       idB,
			idB.String()[:len(unique(idB))+1]: idB,
			other.String()[:5]:                other,
			"v1":                              other,
			"ffffffff":                        idA,
		} {
			got, err := resolveText(tx, "", s)
			if err != nil || got != want {
				t.Errorf("resolve %q: %s %v, want %s", s, got, err, want)
			}
		}
		_, err := resolveText(tx, "", idA.String()[:4])
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "ambiguous") ||
			!strings.Contains(err.Error(), idA.String()[:12]) || !strings.Contains(err.Error(), idB.String()[:12]) {
			t.Errorf("ambiguous prefix: %v", err)
		}
		for s, want := range map[string]error{
			"":                      errdefs.ErrInvalid,
			"abc":                   errdefs.ErrInvalid, // too short, no such tag
			"nope":                  errdefs.ErrNotFound,
			"0000000000":            errdefs.ErrNotFound,
			strings.Repeat("0", 64): errdefs.ErrNotFound,
			"not/a name":            errdefs.ErrNotFound,
		} {
			if _, err := resolveText(tx, "", s); !errors.Is(err, want) {
				t.Errorf("resolve %q: %v, want %v", s, err, want)
			}
		}
		return nil
	})
}

func TestRefs(t *testing.T) {
	c := openTest(t)
	x := put(t, c, testRecord("s", delta.ID{}, 0, t0))
	y := put(t, c, testRecord("s", x, 1, t0))
	update(t, c, func(tx *Tx) error {
		for _, r := range []delta.Ref{
			{Kind: delta.RefHead, Name: "s", Target: x},
			{Kind: delta.RefHead, Name: "s", Target: y}, // moves the head
			{Kind: delta.RefTag, Name: "b", Target: x},
			{Kind: delta.RefTag, Name: "a", Target: y},
		} {
			if err := tx.SetRef(r); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, c, func(tx *Tx) error {
		if head, err := tx.GetRef(delta.RefHead, "s"); err != nil || head != y {
			t.Errorf("head: %s %v", head, err)
		}
		tags, err := tx.Refs(delta.RefTag)
		want := []delta.Ref{{Kind: delta.RefTag, Name: "a", Target: y}, {Kind: delta.RefTag, Name: "b", Target: x}}
		if err != nil || !slices.Equal(tags, want) {
			t.Errorf("tags: %v %v", tags, err)
		}
		if heads, _ := tx.Refs(delta.RefHead); len(heads) != 1 {
			t.Errorf("heads: %v", heads)
		}
		if _, err := tx.GetRef(delta.RefTag, "s"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "tag/s") {
			t.Errorf("kinds are separate namespaces: %v", err)
		}
		return nil
	})
	for name, fn := range map[string]func(tx *Tx) error{
		"dangling":  func(tx *Tx) error { return tx.SetRef(delta.Ref{Kind: delta.RefTag, Name: "z", Target: delta.ID{9}}) },
		"bad name":  func(tx *Tx) error { return tx.SetRef(delta.Ref{Kind: delta.RefTag, Name: ".z", Target: x}) },
		"bad kind":  func(tx *Tx) error { return tx.SetRef(delta.Ref{Kind: "branch", Name: "z", Target: x}) },
		"del again": func(tx *Tx) error { return tx.DeleteRef(delta.RefTag, "gone") },
	} {
		if err := c.Update(t.Context(), fn); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	update(t, c, func(tx *Tx) error { return tx.DeleteRef(delta.RefTag, "a") })
	view(t, c, func(tx *Tx) error {
		if _, err := tx.GetRef(delta.RefTag, "a"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("deleted tag: %v", err)
		}
		return nil
	})
}

func TestSandboxes(t *testing.T) {
	c := openTest(t)
	base := delta.Hash([]byte("base"))
	update(t, c, func(tx *Tx) error {
		for _, n := range []string{"zeta", "alpha", "mid"} {
			if err := tx.PutSandbox(&delta.Sandbox{Name: delta.SandboxName(n), Backend: "overlay", BaseTree: base, Created: t0}); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, c, func(tx *Tx) error {
		all, err := tx.Sandboxes()
		var names []string
		for _, sb := range all {
			names = append(names, string(sb.Name))
		}
		if err != nil || !slices.Equal(names, []string{"alpha", "mid", "zeta"}) {
			t.Errorf("sandboxes: %v %v", names, err)
		}
		if only, err := tx.SandboxNames(); err != nil || !slices.Equal(only, []delta.SandboxName{"alpha", "mid", "zeta"}) {
			t.Errorf("sandbox names: %v %v, want %v", only, err, names)
		}
		if _, err := tx.Sandbox("nope"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
			t.Errorf("missing sandbox: %v", err)
		}
		return nil
	})
	update(t, c, func(tx *Tx) error { return tx.DeleteSandbox("mid") })
	view(t, c, func(tx *Tx) error {
		if only, err := tx.SandboxNames(); err != nil || !slices.Equal(only, []delta.SandboxName{"alpha", "zeta"}) {
			t.Errorf("sandbox names after a delete: %v %v", only, err)
		}
		return nil
	})
	err := c.Update(t.Context(), func(tx *Tx) error { return tx.DeleteSandbox("mid") })
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	err = c.Update(t.Context(), func(tx *Tx) error { return tx.PutSandbox(&delta.Sandbox{Name: "x", Backend: "overlay"}) })
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("sandbox without base: %v", err)
	}
}
