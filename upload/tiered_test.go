package upload_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

func TestTieredConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) upload.Store {
		return upload.NewTiered(newLocal(t, t.TempDir()), newLocal(t, t.TempDir()))
	})
}

// TestTieredFetchesFromS3 is the restore-anywhere path: a fresh host with an
// empty local store reads objects another host put in the bucket.
func TestTieredFetchesFromS3(t *testing.T) {
	srv := miniotest.Start(t)
	cfg := s3Config(srv, srv.Endpoint)
	other := newS3(t, cfg) // what the first host uploaded
	pack := randomBytes(30, 5<<20+7)
	for name, data := range map[string][]byte{"packs/aa/p1": pack, "records/r1": []byte("record"), "refs/main": []byte("remote ref")} {
		if err := upload.PutBytes(t.Context(), other, name, data); err != nil {
			t.Fatal(err)
		}
	}
	local := newLocal(t, t.TempDir())
	counted := upload.NewFaulty(newS3(t, cfg), upload.FaultPlan{})
	s := upload.NewTiered(local, upload.WithRetry(counted, fastRetry))

	// Concurrent readers of one missing pack: one download, every reader
	// gets its range.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			off := int64(i) << 19
			rc, err := upload.GetRange(t.Context(), s, "packs/aa/p1", off, 1000)
			if err != nil {
				t.Errorf("GetRange: %v", err)
				return
			}
			defer rc.Close()
			if got := readAll(t, rc); string(got) != string(pack[off:off+1000]) {
				t.Errorf("GetRange at %d: wrong bytes", off)
			}
		})
	}
	wg.Wait()
	if n := counted.Calls(upload.OpGet); n != 1 {
		t.Errorf("%d remote GETs for one pack read by 8 readers, want 1", n)
	}
	wantStored(t, local, "packs/aa/p1", pack) // now cached
	wantStored(t, s, "records/r1", []byte("record"))

	// A local object and a remote-only one list together, once each.
	if err := upload.PutBytes(t.Context(), s, "refs/main", []byte("local ref")); err != nil {
		t.Fatal(err)
	}
	if err := upload.PutBytes(t.Context(), s, "packs/zz/local-only", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := s.List(t.Context(), "", func(info upload.ObjectInfo) error {
		names = append(names, info.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{"packs/aa/p1", "packs/zz/local-only", "records/r1", "refs/main"}
	if !slices.Equal(names, want) {
		t.Errorf("List = %v, want %v", names, want)
	}
	// Put stays local (the scheduler uploads); the local copy wins reads.
	if _, err := other.Stat(t.Context(), "packs/zz/local-only"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a tiered Put reached the remote store: %v", err)
	}
	wantStored(t, s, "refs/main", []byte("local ref"))

	// Delete removes both copies.
	if err := s.Delete(t.Context(), "records/r1"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []upload.Store{local, other, s} {
		if _, err := st.Stat(t.Context(), "records/r1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("after Delete, Stat: %v, want ErrNotFound", err)
		}
	}
	if _, err := s.Get(t.Context(), "never/was"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of an object neither tier has: %v, want ErrNotFound", err)
	}
}
