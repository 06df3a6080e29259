package history

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/diffview"
	"github.com/turnsnap/turnsnap/engine/procs"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// A tag is a ref object in the store and a ref in the catalog, queued for
// the remote; untagging deletes both and queues the remote deletion.
func TestTags(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	for _, bad := range []string{"HEAD", "abc123", "-x", ""} {
		if _, err := h.v.Tag(ctx, bad, mustRef(h.s0.ID.String())); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("tag %q: %v", bad, err)
		}
	}
	cp, err := h.v.Tag(ctx, "release-1", mustRef("s@HEAD"))
	must(t, err)
	if cp.ID != h.s1.ID {
		t.Fatalf("tagged %s, want the head %s", cp.ID.Short(), h.s1.ID.Short())
	}
	if _, err := h.v.Tag(ctx, "release-1", mustRef(h.s0.ID.String())); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("a second tag of one name: %v", err)
	}
	name := delta.RefName(delta.RefTag, "release-1")
	data, err := upload.ReadAll(ctx, h.local, name)
	must(t, err)
	if id, err := delta.ParseRef(data); err != nil || id != h.s1.ID {
		t.Errorf("ref object: %s, %v", id.Short(), err)
	}
	if tags, err := h.v.Tags(ctx); err != nil || len(tags) != 1 || tags[0].Name != "release-1" || tags[0].Target != h.s1.ID {
		t.Errorf("tags: %+v, %v", tags, err)
	}
	if got, err := h.v.d.Resolve(ctx, "", mustRef("release-1")); err != nil || got.ID != h.s1.ID {
		t.Errorf("a tag resolves as a checkpoint: %v", err)
	}
	queued := func(sandbox string) []catalog.PendingUpload {
		var out []catalog.PendingUpload
		must(t, h.cat.View(ctx, func(tx *catalog.Tx) error {
			var err error
			out, err = tx.PendingUploads(sandbox)
			return err
		}))
		return out
	}
	if q := queued("s"); len(q) != 1 || q[0].Name != name || q[0].Delete {
		t.Errorf("queued for the remote: %+v", q)
	}

	must(t, h.v.Untag(ctx, "release-1"))
	if _, err := upload.ReadAll(ctx, h.local, name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ref object after untag: %v", err)
	}
	if tags, err := h.v.Tags(ctx); err != nil || len(tags) != 0 {
		t.Errorf("tags after untag: %+v, %v", tags, err)
	}
	if q := queued(remote.BackfillSandbox); len(q) != 1 || q[0].Name != name || !q[0].Delete {
		t.Errorf("deletion queued for the remote: %+v", q)
	}
	if err := h.v.Untag(ctx, "release-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("untag of a missing tag: %v", err)
	}
}

// A diff between two checkpoints reads their trees; a diff to the live
// root scans it under the sandbox's lock, into the tree memo (a.txt
// differs there in its mtime). Either reports what an interrupted
// operation left.
func TestDiff(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	paths := func(r *DiffResult) []string {
		var out []string
		for _, p := range r.Paths {
			out = append(out, p.Change+" "+p.Path)
		}
		return out
	}
	r, err := h.v.Diff(ctx, "s", mustRef(h.s0.ID.String()), mustRef(h.s1.ID.String()))
	must(t, err)
	if r.From != h.s0.ID.String() || r.To != h.s1.ID.String() || len(r.Changes) != 2 {
		t.Errorf("diff s0..s1: %+v", r)
	}
	if got, want := paths(r), []string{"modified /a.txt", "added /b.txt"}; !slices.Equal(got, want) {
		t.Errorf("diff s0..s1: %q, want %q", got, want)
	}
	h.intr = &procs.Interrupted{ProcessesLost: "test"}
	r, err = h.v.DiffWith(ctx, "s", mustRef(""), mustRef(""), diffview.Options{Patch: true})
	must(t, err)
	if r.From != h.s1.ID.String() || r.To != "working" || r.Interrupted != h.intr || h.ops != 2 {
		t.Errorf("diff head..working: %+v (sandbox locks %d)", r, h.ops)
	}
	if got, want := paths(r), []string{"modified /a.txt", "deleted /b.txt", "added /d.txt"}; !slices.Equal(got, want) {
		t.Errorf("diff head..working: %q, want %q", got, want)
	}
	if _, err := h.v.Diff(ctx, "s", mustRef("nosuchtag"), mustRef("")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("diff from a missing checkpoint: %v", err)
	}
}

// The audit is the head's line, oldest first, turn by turn.
func TestAudit(t *testing.T) {
	ctx := context.Background()
	h := newHome(t)
	rep, err := h.v.Audit(ctx, "b")
	must(t, err)
	var ids []delta.ID
	for _, turn := range rep.Turns {
		ids = append(ids, turn.Checkpoint)
	}
	if want := []delta.ID{h.s0.ID, h.s1.ID, h.b0.ID}; !slices.Equal(ids, want) {
		t.Errorf("audit of b: %v, want %v", ids, want)
	}
	if rep.Sandbox != "b" || rep.Totals.Turns != 3 || rep.Totals.BytesNew != 100+200+100 {
		t.Errorf("audit of b: %+v", rep)
	}
}
