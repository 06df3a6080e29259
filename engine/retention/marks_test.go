package retention

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// With a remote, a prune with a grace only marks (the mark object names
// each record with its due time); a later run with no grace sweeps them
// from the bucket, the local store and the catalog, and removes the empty
// mark object. A ref in the bucket naming a marked record unmarks it.
func TestPruneWithARemoteMarksThenSweeps(t *testing.T) {
	ctx := context.Background()
	h := newHome(t, true, 5)
	rep, err := h.rt.Prune(ctx, PruneOptions{KeepLast: 1, Grace: time.Hour})
	must(t, err)
	if len(rep.Deleted) != 0 || len(rep.Marked) != 4 {
		t.Fatalf("prune with a grace deleted %v, marked %d; want none, 4", rep.Deleted, len(rep.Marked))
	}
	markName := delta.MarkName(h.parts.HomeID)
	data, err := upload.ReadAll(ctx, h.parts.Remote, markName)
	must(t, err)
	m, err := delta.DecodeMarks(markName, data)
	must(t, err)
	if len(m.Records) != 4 || time.Until(m.Records[0].Due) < 59*time.Minute {
		t.Fatalf("mark object: %+v", m)
	}
	if cat, _, bucket := h.left(t); len(cat) != 5 || len(bucket) != 5 {
		t.Fatalf("marking deleted records: catalog %v, bucket %v", cat, bucket)
	}

	// Another home tags turn 1 before the sweep.
	must(t, upload.PutBytes(ctx, h.parts.Remote, delta.RefName(delta.RefTag, "theirs"), delta.EncodeRef(h.cps[1].ID)))
	rep, err = h.rt.Prune(ctx, PruneOptions{KeepLast: 1})
	must(t, err)
	if len(rep.Deleted) != 3 || len(rep.Marked) != 0 {
		t.Fatalf("prune with no grace deleted %v, marked %v; want 3, none", rep.Deleted, rep.Marked)
	}
	cat, local, bucket := h.left(t)
	for _, got := range [][]int{cat, local, bucket} {
		if !slices.Equal(got, []int{1, 4}) {
			t.Fatalf("left: catalog %v, local %v, bucket %v; want turns 1 (tagged in the bucket) and 4 (head)", cat, local, bucket)
		}
	}
	if _, err := h.parts.Remote.Stat(ctx, markName); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("mark object after the sweep: %v, want none", err)
	}
}

// bucketPins reads every kind of ref: heads with and without an owner
// line, tags, and branch origins; a damaged ref fails it (retention that
// cannot see every ref deletes nothing).
func TestBucketPins(t *testing.T) {
	ctx := context.Background()
	s, err := upload.NewLocal(t.TempDir())
	must(t, err)
	id := func(s string) delta.ID { return delta.Hash([]byte(s)) }
	put := func(name string, data []byte) { must(t, upload.PutBytes(ctx, s, name, data)) }
	sbA, sbB, home := delta.NewSandboxID(), delta.NewSandboxID(), delta.NewSandboxID()
	put(delta.HeadObject(delta.SandboxKey(sbA)), delta.EncodeRef(id("plain head")))
	put(delta.HeadObject(delta.SandboxKey(sbB)), delta.EncodeHead(id("owned head"), delta.Owner{Home: home, Epoch: 3}))
	put(delta.RefName(delta.RefTag, "release"), delta.EncodeRef(id("tagged")))
	for _, d := range []delta.Sandbox{
		{ID: sbA, Home: home, Name: "a", Backend: "overlay", BaseTree: id("base"), Origin: id("origin")},
		{ID: sbB, Home: home, Name: "b", Backend: "overlay", BaseTree: id("base")}, // from a base: no origin
	} {
		data, err := json.Marshal(d)
		must(t, err)
		put(delta.SandboxObject(delta.SandboxKey(d.ID)), data)
	}
	pin := Pins{}
	must(t, bucketPins(ctx, s, pin))
	for what, want := range map[string]delta.ID{"head": id("plain head"), "owned head": id("owned head"), "tag": id("tagged"), "origin": id("origin")} {
		if len(pin[want]) == 0 {
			t.Errorf("%s %s not pinned: %v", what, want.Short(), pin)
		}
	}
	if len(pin) != 4 {
		t.Errorf("pinned %d checkpoints, want 4: %v", len(pin), pin)
	}
	if why := strings.Join(pin[id("origin")], ","); !strings.Contains(why, "branched: a") {
		t.Errorf("origin pinned for %q", why)
	}

	put(delta.HeadObject(delta.SandboxKey(delta.NewSandboxID())), []byte("not a ref\n"))
	if err := bucketPins(ctx, s, Pins{}); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("bucketPins over a damaged head: %v, want ErrCorrupt", err)
	}
}
