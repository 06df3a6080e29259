package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// condStore is an in-memory store with conditional writes, for the unit
// tests of the head-writing rules; engine/owner_test.go proves the same
// rules on a real MinIO.
type condStore struct {
	mu   sync.Mutex
	objs map[string][]byte
	tags map[string]string
	seq  int
	// beforePut, if set, runs before a conditional write is judged (a
	// concurrent writer getting there first).
	beforePut func(name string)
}

func newCondStore() *condStore {
	return &condStore{objs: map[string][]byte{}, tags: map[string]string{}}
}

func (s *condStore) Put(_ context.Context, name string, r io.Reader, _ int64) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.objs[name], s.tags[name] = data, fmt.Sprint(s.seq)
	return nil
}

func (s *condStore) Get(_ context.Context, name string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.objs[name]
	if !ok {
		return nil, fmt.Errorf("object %s: %w", name, errdefs.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(d)), nil
}

func (s *condStore) Stat(_ context.Context, name string) (upload.ObjectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.objs[name]
	if !ok {
		return upload.ObjectInfo{}, fmt.Errorf("object %s: %w", name, errdefs.ErrNotFound)
	}
	return upload.ObjectInfo{Name: name, Size: int64(len(d)), ModTime: time.Now()}, nil
}

func (s *condStore) List(_ context.Context, prefix string, fn func(upload.ObjectInfo) error) error {
	return nil
}

func (s *condStore) Delete(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, name)
	return nil
}

func (s *condStore) GetVersion(ctx context.Context, name string, max int64) ([]byte, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.objs[name]
	if !ok {
		return nil, "", fmt.Errorf("object %s: %w", name, errdefs.ErrNotFound)
	}
	return d, s.tags[name], nil
}

func (s *condStore) PutIf(ctx context.Context, name string, data []byte, match string) (string, error) {
	if s.beforePut != nil {
		s.beforePut(name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.tags[name]; ok && cur != match || !ok && match != "" {
		return "", fmt.Errorf("object %s: %w", name, upload.ErrConditionFailed)
	}
	s.seq++
	s.objs[name], s.tags[name] = data, fmt.Sprint(s.seq)
	return s.tags[name], nil
}

func headSyncer(t *testing.T, remote upload.Store, home string, sbs ...*delta.Sandbox) (*Syncer, upload.Store) {
	t.Helper()
	ctx := context.Background()
	cat, err := catalog.Open(ctx, t.TempDir(), catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	if err := cat.Update(ctx, func(tx *catalog.Tx) error {
		for _, sb := range sbs {
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	local := newCondStore()
	return &Syncer{Local: local, Remote: remote, Cat: cat, HomeID: home, Log: slog.Default()}, local
}

func headJob(t *testing.T, local upload.Store, key string, target delta.ID) job {
	t.Helper()
	name := delta.HeadObject(delta.SandboxKey(key))
	if err := upload.PutBytes(context.Background(), local, name, delta.EncodeRef(target)); err != nil {
		t.Fatal(err)
	}
	return job{PendingUpload: catalog.PendingUpload{Sandbox: "s", Name: name}}
}

func TestWriteHeadRules(t *testing.T) {
	ctx := context.Background()
	homeA, homeB := delta.NewSandboxID(), delta.NewSandboxID()
	sb := &delta.Sandbox{ID: delta.NewSandboxID(), Home: homeA, Name: "s", Backend: "overlay", BaseTree: delta.Hash([]byte("base"))}
	key := sb.Key()
	name := delta.HeadObject(delta.SandboxKey(key))
	t1, t2 := delta.Hash([]byte("one")), delta.Hash([]byte("two"))
	remote := newCondStore()
	// A head is written only once its record is in the bucket.
	ahead := delta.Hash([]byte("not pushed yet"))
	{
		a, localA := headSyncer(t, remote, homeA, sb)
		if err := a.writeHead(ctx, headJob(t, localA, string(key), ahead)); !errors.Is(err, errHeadAhead) {
			t.Fatalf("head naming a record the bucket lacks: %v, want errHeadAhead", err)
		}
		if _, ok := remote.objs[name]; ok {
			t.Fatal("a head was written before its record")
		}
	}
	for _, id := range []delta.ID{t1, t2} {
		remote.objs[delta.RecordName(id)] = []byte("record")
	}
	read := func() (delta.ID, delta.Owner) {
		id, o, err := delta.ParseHead(remote.objs[name])
		if err != nil {
			t.Fatal(err)
		}
		return id, o
	}

	// The creator writes the first head as epoch 1.
	a, localA := headSyncer(t, remote, homeA, sb)
	if err := a.writeHead(ctx, headJob(t, localA, string(key), t1)); err != nil {
		t.Fatal(err)
	}
	if id, o := read(); id != t1 || o != (delta.Owner{Home: homeA, Epoch: 1}) {
		t.Fatalf("first head %s %v", id.Short(), o)
	}
	// Another home that knows the sandbox but never adopted it is fenced.
	b, localB := headSyncer(t, remote, homeB, sb)
	if err := b.writeHead(ctx, headJob(t, localB, string(key), t2)); !errors.Is(err, ErrFenced) {
		t.Fatalf("non-owner's head write: %v, want ErrFenced", err)
	}
	if id, _ := read(); id != t1 {
		t.Fatal("a fenced write changed the head")
	}
	// B adopts (as Home.Adopt does): epoch 2. A's next write is fenced
	// and A notes the new owner.
	if _, err := remote.PutIf(ctx, name, delta.EncodeHead(t1, delta.Owner{Home: homeB, Epoch: 2}), remote.tags[name]); err != nil {
		t.Fatal(err)
	}
	if err := a.writeHead(ctx, headJob(t, localA, string(key), t2)); !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), homeB) {
		t.Fatalf("old owner's head write after adoption: %v, want ErrFenced naming %s", err, homeB)
	}
	a.Cat.View(ctx, func(tx *catalog.Tx) error {
		o, found, err := tx.SandboxOwner(key)
		if err != nil || !found || o.Home != homeB {
			t.Fatalf("fenced home noted owner %v (found %v, %v), want %s", o, found, err, homeB)
		}
		return nil
	})
	// The adopter writes as epoch 2.
	if err := b.writeHead(ctx, headJob(t, localB, string(key), t2)); err != nil {
		t.Fatal(err)
	}
	if id, o := read(); id != t2 || o != (delta.Owner{Home: homeB, Epoch: 2}) {
		t.Fatalf("adopter's head %s %v", id.Short(), o)
	}
	// An adoption between the owner's read and write: the conditional
	// write loses, and the second round sees the fence.
	adopted := false
	remote.beforePut = func(string) {
		if !adopted {
			adopted = true
			remote.mu.Lock()
			remote.seq++
			remote.objs[name], remote.tags[name] = delta.EncodeHead(t2, delta.Owner{Home: homeA, Epoch: 3}), fmt.Sprint(remote.seq)
			remote.mu.Unlock()
		}
	}
	if err := b.writeHead(ctx, headJob(t, localB, string(key), t1)); !errors.Is(err, ErrFenced) {
		t.Fatalf("a write racing an adoption: %v, want ErrFenced", err)
	}
	if id, o := read(); id != t2 || o.Epoch != 3 {
		t.Fatalf("after the race: %s %v", id.Short(), o)
	}
}

func TestWriteHeadNeedsConditionalWrites(t *testing.T) {
	sb := &delta.Sandbox{ID: delta.NewSandboxID(), Home: delta.NewSandboxID(), Name: "s", Backend: "overlay", BaseTree: delta.Hash([]byte("b"))}
	plain := newCondStore()
	target := delta.Hash([]byte("x"))
	plain.objs[delta.RecordName(target)] = []byte("record")
	s, local := headSyncer(t, struct{ upload.Store }{plain}, sb.Home, sb)
	err := s.writeHead(context.Background(), headJob(t, local, string(sb.Key()), target))
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "conditional writes") {
		t.Fatalf("head write on a store without conditional writes: %v", err)
	}
}
