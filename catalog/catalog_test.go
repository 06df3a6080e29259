package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// These tests use a real Badger database in t.TempDir(); nothing else is needed.

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func openAt(t *testing.T, dir string) *Catalog {
	t.Helper()
	c, err := Open(context.Background(), dir, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func openTest(t *testing.T) *Catalog { return openAt(t, t.TempDir()) }

func update(t *testing.T, c *Catalog, fn func(tx *Tx) error) {
	t.Helper()
	if err := c.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func view(t *testing.T, c *Catalog, fn func(tx *Tx) error) {
	t.Helper()
	if err := c.View(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func TestReopenPersists(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cp := testRecord("s1", delta.ID{}, 0, t0)
	sb := &delta.Sandbox{Name: "s1", Backend: "btrfs", BaseTree: cp.BaseTree, Created: t0,
		Config: json.RawMessage(`{"pool":"/var/lib/turnsnap"}`)}
	blob := delta.Hash([]byte("blob"))
	loc := BlobLocation{Pack: delta.Hash([]byte("pack")), Type: delta.BlobTree, Offset: 7, Length: 9, RawLength: 20, Compression: 1}
	update(t, c, func(tx *Tx) error {
		if err := tx.PutSandbox(sb); err != nil {
			return err
		}
		if err := tx.PutCheckpoint(cp); err != nil {
			return err
		}
		if err := tx.SetRef(delta.Ref{Kind: delta.RefHead, Name: "s1", Target: cp.ID}); err != nil {
			return err
		}
		if err := tx.PutBlob(blob, loc); err != nil {
			return err
		}
		_, err := tx.AddRefCount(blob, 3)
		return err
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.View(context.Background(), func(*Tx) error { return nil }); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("View after Close: %v", err)
	}

	c = openAt(t, dir)
	view(t, c, func(tx *Tx) error {
		got, err := tx.Checkpoint(cp.ID)
		if err != nil || got.Turn != cp.Turn || !got.Created.Equal(t0) {
			t.Errorf("checkpoint after reopen: %+v, %v", got, err)
		}
		gsb, err := tx.Sandbox("s1")
		if err != nil || string(gsb.Config) != `{"pool":"/var/lib/turnsnap"}` || gsb.BaseTree != sb.BaseTree || !gsb.Created.Equal(t0) {
			t.Errorf("sandbox after reopen: %+v, %v", gsb, err)
		}
		if head, err := tx.GetRef(delta.RefHead, "s1"); err != nil || head != cp.ID {
			t.Errorf("head after reopen: %s, %v", head, err)
		}
		if l, ok, err := tx.Blob(blob); err != nil || !ok || l != loc {
			t.Errorf("blob after reopen: %+v %v %v", l, ok, err)
		}
		if n, err := tx.RefCount(blob); err != nil || n != 3 {
			t.Errorf("refcount after reopen: %d %v", n, err)
		}
		return nil
	})
}

func TestSchemaVersionMismatch(t *testing.T) {
	dir := t.TempDir()
	c := openAt(t, dir)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Rewrite the version behind the catalog's back, as a newer turnsnap would.
	db, err := badger.Open(badgerOptions(dir, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(SchemaVersion + 1)
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set(schemaKey(), v) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), dir, Options{Logger: testLogger(t)})
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("err %v, want ErrPrecondition", err)
	}
	for _, want := range []string{dir, "schema version 2", "reads version 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// The failed Open released the directory: trying again fails the same way.
	if _, err := Open(context.Background(), dir, Options{}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("second Open: err %v, want ErrPrecondition", err)
	}
}

func TestForeignBadgerDirRefused(t *testing.T) {
	dir := t.TempDir()
	db, err := badger.Open(badgerOptions(dir, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(context.Background(), dir, Options{}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("err %v, want ErrPrecondition", err)
	}
}

func TestOpenCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, t.TempDir(), Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	c := openTest(t)
	if err := c.View(ctx, func(*Tx) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("View: err %v", err)
	}
	if err := c.AddRefCounts(ctx, map[delta.ID]int64{{1}: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("AddRefCounts: err %v", err)
	}
}

func TestViewIsReadOnly(t *testing.T) {
	c := openTest(t)
	err := c.View(context.Background(), func(tx *Tx) error {
		return tx.PutSandbox(&delta.Sandbox{Name: "s", Backend: "overlay", BaseTree: delta.ID{1}})
	})
	if err == nil {
		t.Fatal("write in View succeeded")
	}
}

func TestUpdateRetriesConflicts(t *testing.T) {
	c := openTest(t)
	id := delta.Hash([]byte("shared"))
	const writers, each = 4, 25
	var wg sync.WaitGroup
	var applied atomic.Int64
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := c.Update(context.Background(), func(tx *Tx) error {
					_, err := tx.AddRefCount(id, 1)
					return err
				})
				// Heavy contention may exhaust the retries; that must say so.
				if err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
					errs <- err
					return
				}
				if err == nil {
					applied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	view(t, c, func(tx *Tx) error {
		n, err := tx.RefCount(id)
		if err != nil || n != applied.Load() || n == 0 {
			t.Errorf("count %d %v, want %d", n, err, applied.Load())
		}
		return nil
	})
}
