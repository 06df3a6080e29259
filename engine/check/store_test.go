package check

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// noRepo reads no blobs: the store checked holds no packs.
type noRepo struct{}

func (noRepo) LoadBlob(context.Context, delta.BlobType, delta.ID) ([]byte, error) {
	return nil, errdefs.ErrNotFound
}

func (noRepo) Decode(delta.ID, string, catalog.BlobLocation, []byte) ([]byte, error) {
	return nil, errdefs.ErrNotFound
}

func (noRepo) LoaderFor(map[delta.ID]catalog.BlobLocation) delta.BlobLoader { return noRepo{} }

func storeVerifier(store upload.Store) *Verifier {
	return NewVerifier(Deps{
		Store:  func() upload.Store { return store },
		Repo:   func() Repo { return noRepo{} },
		Keys:   func() *delta.Keys { return nil },
		IDs:    func() delta.IDs { return delta.IDs{} },
		HomeID: func() string { return "" },
	})
}

// VerifyStore checks refs against the records the store holds, and names
// the object at fault.
func TestVerifyStoreNamesADanglingRef(t *testing.T) {
	ctx := context.Background()
	store, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v := storeVerifier(store)
	rep, err := v.VerifyStore(ctx, mustRef(""))
	if err != nil || rep.Packs != 0 || rep.Refs != 0 || len(rep.Checkpoints) != 0 {
		t.Fatalf("an empty store: %+v, %v", rep, err)
	}
	if _, err := v.VerifyStore(ctx, mustRef("nosuch")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("verify of a reference the store lacks: %v", err)
	}
	tag := delta.RefName(delta.RefTag, "gone")
	if err := upload.PutBytes(ctx, store, tag, delta.EncodeRef(delta.Hash([]byte("pruned")))); err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifyStore(ctx, mustRef("")); !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), tag) {
		t.Fatalf("a tag naming a record the store lacks: %v", err)
	}
}
