package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// refWorld is one history written twice, as a catalog and as a store, for
// the resolvers to read.
type refWorld struct {
	cat     *catalog.Catalog
	store   upload.Store
	records []delta.ID
	homeID  string
}

func (w *refWorld) put(t *testing.T, ctx context.Context, cps []*delta.Checkpoint, sbs []*delta.Sandbox, heads map[string]delta.ID, tags map[string]delta.ID) {
	t.Helper()
	err := w.cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, cp := range cps {
			data, id, err := delta.EncodeRecord(cp)
			if err != nil {
				return err
			}
			if err := upload.PutBytes(ctx, w.store, delta.RecordName(id), data); err != nil {
				return err
			}
			if err := tx.PutCheckpoint(cp); err != nil {
				return err
			}
			w.records = append(w.records, id)
		}
		for _, sb := range sbs {
			data, _ := json.Marshal(sb)
			if err := upload.PutBytes(ctx, w.store, delta.SandboxObject(sb.Key()), data); err != nil {
				return err
			}
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
			if err := upload.PutBytes(ctx, w.store, delta.HeadObject(sb.Key()), delta.EncodeRef(heads[string(sb.Name)])); err != nil {
				return err
			}
			if err := tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: string(sb.Name), Target: heads[string(sb.Name)]}); err != nil {
				return err
			}
		}
		for name, id := range tags {
			if err := upload.PutBytes(ctx, w.store, delta.RefName(delta.RefTag, name), delta.EncodeRef(id)); err != nil {
				return err
			}
			if err := tx.SetRef(delta.Ref{Kind: delta.RefTag, Name: name, Target: id}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(w.records, compareIDs)
}

func testRecord(t *testing.T, sb *delta.Sandbox, parent delta.ID, turn int) *delta.Checkpoint {
	t.Helper()
	cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: sb.Name, SandboxID: sb.ID, Parent: parent, Turn: turn,
		Class: delta.ClassFS, Backend: sb.Backend, BaseTree: sb.BaseTree, FSTree: delta.Hash([]byte(fmt.Sprint(sb.Name, turn))),
		Created: time.Unix(int64(1000+turn), 0).UTC()}
	_, id, err := delta.EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	cp.ID = id
	return cp
}

// The store's resolver (verify --store-only) and the catalog's apply the
// same rules: every reference resolves to the same checkpoint, or fails
// with the same class of error, through both.
func TestStoreAndCatalogResolveAlike(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := &refWorld{homeID: delta.NewSandboxID()}
	var err error
	if w.store, err = upload.NewLocal(filepath.Join(dir, "store")); err != nil {
		t.Fatal(err)
	}
	if w.cat, err = catalog.Open(ctx, filepath.Join(dir, "catalog"), catalog.Options{}); err != nil {
		t.Fatal(err)
	}
	defer w.cat.Close()

	base := delta.Hash([]byte("base"))
	s := &delta.Sandbox{ID: delta.NewSandboxID(), Home: w.homeID, Name: "s", Backend: "overlay", BaseTree: base, Created: time.Unix(1, 0).UTC()}
	c1 := testRecord(t, s, delta.ID{}, 1)
	c2 := testRecord(t, s, c1.ID, 2)
	c3 := testRecord(t, s, c2.ID, 3)
	// Two checkpoints of another sandbox whose IDs share their first
	// MinPrefixLen digits: that prefix is ambiguous.
	o := &delta.Sandbox{ID: delta.NewSandboxID(), Home: w.homeID, Name: "o", Backend: "overlay", BaseTree: base, Created: time.Unix(2, 0).UTC()}
	seen := map[string]*delta.Checkpoint{}
	var pair [2]*delta.Checkpoint
	for turn := 0; pair[0] == nil; turn++ {
		cp := testRecord(t, o, delta.ID{}, turn)
		p := cp.ID.String()[:catalog.MinPrefixLen]
		if other, ok := seen[p]; ok {
			pair = [2]*delta.Checkpoint{other, cp}
		}
		seen[p] = cp
	}
	cps := []*delta.Checkpoint{c1, c2, c3, pair[0], pair[1]}
	unique := func(id delta.ID) string { // the shortest prefix only id has
		for n := catalog.MinPrefixLen; ; n++ {
			p, count := id.String()[:n], 0
			for _, cp := range cps {
				if strings.HasPrefix(cp.ID.String(), p) {
					count++
				}
			}
			if count == 1 {
				return p
			}
		}
	}
	p2 := unique(c2.ID)
	noID := "beef"
	for slices.ContainsFunc(cps, func(cp *delta.Checkpoint) bool { return strings.HasPrefix(cp.ID.String(), noID) }) {
		noID += "0"
	}
	tags := map[string]delta.ID{
		"v1":  c1.ID,
		p2:    c3.ID, // a hex tag that is also a checkpoint's prefix: the checkpoint wins
		noID:  c2.ID, // a hex tag that matches no checkpoint: the tag
		"abc": c3.ID, // shorter than a prefix may be: only a tag
	}
	w.put(t, ctx, cps, []*delta.Sandbox{s, o}, map[string]delta.ID{"s": c3.ID, "o": pair[1].ID}, tags)

	cases := []struct {
		ref  string
		want delta.ID
		err  error // the class, when it fails
	}{
		{c1.ID.String(), c1.ID, nil},
		{unique(c1.ID), c1.ID, nil},
		{strings.ToUpper(unique(c3.ID)), c3.ID, nil},
		{p2, c2.ID, nil},
		{noID, c2.ID, nil},
		{"abc", c3.ID, nil},
		{"abd", delta.ID{}, errdefs.ErrInvalid},
		{"v1", c1.ID, nil},
		{"v1~1", delta.ID{}, errdefs.ErrNotFound},
		{"nosuchtag", delta.ID{}, errdefs.ErrNotFound},
		{pair[0].ID.String()[:catalog.MinPrefixLen], delta.ID{}, errdefs.ErrInvalid},
		{"s@HEAD", c3.ID, nil},
		{"s@HEAD~", c2.ID, nil},
		{"s@HEAD~1~1", c1.ID, nil},
		{"s@HEAD~3", delta.ID{}, errdefs.ErrNotFound},
		{p2 + "~1", c1.ID, nil},
		{"o@HEAD", pair[1].ID, nil},
		{"HEAD", delta.ID{}, errdefs.ErrInvalid},
		{"nobody@HEAD", delta.ID{}, errdefs.ErrNotFound},
		{"s@HEAD^", delta.ID{}, errdefs.ErrInvalid},
		{"v1~x", delta.ID{}, errdefs.ErrInvalid},
	}
	for _, c := range cases {
		var fromCat, fromStore delta.ID
		r, storeErr := catalog.ParseCheckpointRef(c.ref)
		catErr := storeErr
		if catErr == nil {
			catErr = w.cat.View(ctx, func(tx *catalog.Tx) (err error) { fromCat, err = tx.ResolveRef("", r); return err })
		}
		if storeErr == nil {
			fromStore, storeErr = ResolveInStore(ctx, w.store, w.homeID, r, w.records)
		}
		for _, r := range []struct {
			by  string
			id  delta.ID
			err error
		}{{"catalog", fromCat, catErr}, {"store", fromStore, storeErr}} {
			switch {
			case c.err == nil && (r.err != nil || r.id != c.want):
				t.Errorf("%s resolves %q to %s, %v; want %s", r.by, c.ref, r.id.Short(), r.err, c.want.Short())
			case c.err != nil && !errors.Is(r.err, c.err):
				t.Errorf("%s resolves %q to %s, %v; want %v", r.by, c.ref, r.id.Short(), r.err, c.err)
			}
		}
	}
}
