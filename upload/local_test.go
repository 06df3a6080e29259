package upload_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

func newLocal(t *testing.T, dir string) upload.Store {
	t.Helper()
	s, err := upload.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLocalConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) upload.Store { return newLocal(t, t.TempDir()) })
}

// onlyStore hides a store's optional interfaces, to test the fallbacks.
type onlyStore struct{ upload.Store }

func TestLocalWithoutRangeGetterConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) upload.Store { return onlyStore{newLocal(t, t.TempDir())} })
}

func TestLocalIsRangeGetter(t *testing.T) {
	if _, ok := newLocal(t, t.TempDir()).(upload.RangeGetter); !ok {
		t.Fatal("the local store does not implement RangeGetter")
	}
}

func TestGetRangePastEnd(t *testing.T) {
	for _, s := range []upload.Store{newLocal(t, t.TempDir()), onlyStore{newLocal(t, t.TempDir())}} {
		if err := upload.PutBytes(t.Context(), s, "obj", []byte("0123456789")); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			off, n int64
			want   string
		}{{8, 5, "89"}, {10, 3, ""}, {20, 3, ""}, {3, 0, ""}} {
			rc, err := upload.GetRange(t.Context(), s, "obj", tc.off, tc.n)
			if err != nil {
				t.Fatalf("%T: GetRange %d+%d: %v", s, tc.off, tc.n, err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || string(got) != tc.want {
				t.Errorf("%T: GetRange %d+%d = %q, %v; want %q", s, tc.off, tc.n, got, err, tc.want)
			}
		}
		if _, err := upload.GetRange(t.Context(), s, "obj", -1, 3); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%T: GetRange at -1: got error %v, want ErrInvalid", s, err)
		}
	}
}

// TestLocalLayout pins where objects live on disk, which operators and the
// format documentation rely on, and that failed Puts leave no temporary files.
func TestLocalLayout(t *testing.T) {
	dir := t.TempDir()
	s := newLocal(t, dir)
	if err := upload.PutBytes(t.Context(), s, "packs/ab/cd", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "packs", "ab", "cd")); err != nil || string(b) != "x" {
		t.Fatalf("dir/packs/ab/cd = %q, %v; want the object", b, err)
	}
	if err := s.Put(t.Context(), "short", bytes.NewReader([]byte("ab")), 3); err == nil {
		t.Fatal("short Put: no error")
	}
	wantNoTemp(t, dir)
	info, err := os.Stat(filepath.Join(dir, "packs"))
	if err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("dir/packs: %v, %v; want a 0700 directory", info.Mode(), err)
	}
}

func TestLocalReservesTmp(t *testing.T) {
	s := newLocal(t, t.TempDir())
	for _, name := range []string{".tmp", ".tmp/x"} {
		if err := upload.PutBytes(t.Context(), s, name, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Put %s: got error %v, want ErrInvalid", name, err)
		}
	}
	// Names that merely start with the same letters are ordinary.
	if err := upload.PutBytes(t.Context(), s, ".tmpfile", nil); err != nil {
		t.Errorf("Put .tmpfile: %v", err)
	}
}

func TestLocalDirectoryIsNotAnObject(t *testing.T) {
	dir := t.TempDir()
	s := newLocal(t, dir)
	if err := upload.PutBytes(t.Context(), s, "d/obj", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(t.Context(), "d"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat of a directory: got error %v, want ErrNotFound", err)
	}
	if _, err := s.Get(t.Context(), "d"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of a directory: got error %v, want ErrNotFound", err)
	}
	if err := s.Delete(t.Context(), "d"); err != nil {
		t.Errorf("Delete of a directory: %v", err)
	}
	if _, err := s.Stat(t.Context(), "d/obj"); err != nil {
		t.Errorf("Delete of a directory removed what it held: %v", err)
	}
}

// TestLocalCleansStaleTemp checks that NewLocal removes a crashed Put's
// leftovers but not a temporary file that may belong to a Put in progress.
func TestLocalCleansStaleTemp(t *testing.T) {
	dir := t.TempDir()
	newLocal(t, dir)
	tmp := filepath.Join(dir, ".tmp")
	stale, fresh := filepath.Join(tmp, "put-stale"), filepath.Join(tmp, "put-fresh")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	s := newLocal(t, dir)
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file survived NewLocal: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh temp file removed by NewLocal: %v", err)
	}
	var names []string
	if err := s.List(context.Background(), "", func(i upload.ObjectInfo) error {
		names = append(names, i.Name)
		return nil
	}); err != nil || len(names) != 0 {
		t.Errorf("List lists temporary files: %v, %v", names, err)
	}
}

func wantNoTemp(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, ".tmp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("temporary file %s left behind", e.Name())
	}
}
