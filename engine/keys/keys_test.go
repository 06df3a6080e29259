package keys

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newKeyFile(t *testing.T) (string, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "master.key")
	id, err := GenerateKeyFile(p)
	must(t, err)
	return p, id
}

func newStore(t *testing.T) upload.Store {
	t.Helper()
	s, err := upload.NewLocal(t.TempDir())
	must(t, err)
	return s
}

// rig is a Ring with the engine's side recorded: the saved config, the
// stores it was last wired to, the renewals and the exclusive lock.
type rig struct {
	*Ring
	saved   *Config
	store   upload.Store // the store last wired
	remote  upload.Store
	renewed int
	maint   sync.Mutex
}

func newRig(t *testing.T, local, remote upload.Store, cfg *Config) *rig {
	t.Helper()
	r := &rig{saved: cfg}
	r.Ring = New(Deps{Home: "/test/home", Local: local, Remote: remote, Config: cfg,
		Save:  func(c *Config) error { r.saved = c; return nil },
		Wired: func(_, remote, store upload.Store) { r.store, r.remote = store, remote },
		Renew: func(context.Context) error { r.renewed++; return nil },
		Exclusive: func() func() {
			r.maint.Lock()
			return r.maint.Unlock
		},
	})
	must(t, r.Load(context.Background()))
	return r
}

func TestKeyFiles(t *testing.T) {
	p, id := newKeyFile(t)
	fi, err := os.Stat(p)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %o", fi.Mode().Perm())
	}
	m, err := ReadKeyFile(p)
	must(t, err)
	if m.ID() != id {
		t.Fatalf("read key %s, generated %s", m.ID(), id)
	}
	if _, err := GenerateKeyFile(p); !errors.Is(err, errdefs.ErrExists) {
		t.Fatalf("generate over an existing key file: %v, want ErrExists", err)
	}
	if again, err := ReadKeyFile(p); err != nil || again.ID() != id {
		t.Fatalf("the key file changed: %v", err)
	}
	must(t, os.Chmod(p, 0o644))
	if _, err := ReadKeyFile(p); !errors.Is(err, errdefs.ErrKey) {
		t.Fatalf("a key file others can read: %v, want ErrKey", err)
	}
	if _, err := ReadKeyFile(p + ".missing"); !errors.Is(err, errdefs.ErrKey) {
		t.Fatalf("a missing key file: %v, want ErrKey", err)
	}
}

// A plaintext home set up with a key gets a data key in its store, seals
// what it writes, and opens again with the saved configuration; setting
// up again with the same key changes nothing, another key is refused.
func TestSetUpAndLoad(t *testing.T) {
	ctx := context.Background()
	raw := newStore(t)
	r := newRig(t, raw, nil, nil)
	if r.Encrypted() || r.KeyID() != "" || r.IDs().Keyed() || r.store == nil {
		t.Fatalf("plaintext ring: encrypted %v, key %q, wired %v", r.Encrypted(), r.KeyID(), r.store)
	}
	kf, id := newKeyFile(t)
	must(t, r.SetUp(ctx, kf, false))
	if !r.Encrypted() || r.KeyID() != id || !r.IDs().Keyed() || r.renewed != 1 || r.LocalKeys() == nil {
		t.Fatalf("after setup: encrypted %v, key %q, keyed %v, renewed %d", r.Encrypted(), r.KeyID(), r.IDs().Keyed(), r.renewed)
	}
	if r.saved == nil || r.saved.KeyID != id || r.saved.IDs != delta.SchemeKeyed || r.saved.PlainLocal || !filepath.IsAbs(r.saved.KeyFile) {
		t.Fatalf("saved config %+v", r.saved)
	}
	if _, err := raw.Stat(ctx, delta.KeyName(id)); err != nil {
		t.Fatalf("no key object: %v", err)
	}
	// The wired store seals; the raw one holds only the sealed bytes.
	name, plain := delta.RecordPrefix+"probe", []byte("plaintext record")
	must(t, upload.PutBytes(ctx, r.store, name, plain))
	got, err := upload.ReadAll(ctx, raw, name)
	must(t, err)
	if bytes.Contains(got, plain) {
		t.Fatal("the wired store wrote plaintext")
	}
	if back, err := upload.ReadAll(ctx, r.store, name); err != nil || !bytes.Equal(back, plain) {
		t.Fatalf("read back through the wired store: %q %v", back, err)
	}

	must(t, r.SetUp(ctx, kf, false))
	if r.renewed != 1 {
		t.Fatal("setting up again with the same key renewed the catalog")
	}
	if err := r.SetUp(ctx, kf, true); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("switching --encrypt-local: %v, want ErrPrecondition", err)
	}
	other, _ := newKeyFile(t)
	if err := r.SetUp(ctx, other, false); !errors.Is(err, errdefs.ErrKey) {
		t.Fatalf("another key: %v, want ErrKey", err)
	}

	// The home opens again from its saved configuration.
	o := newRig(t, raw, nil, r.saved)
	if !o.Encrypted() || o.IDs() != r.IDs() {
		t.Fatal("reopened ring has other keys")
	}
	if back, err := upload.ReadAll(ctx, o.store, name); err != nil || !bytes.Equal(back, plain) {
		t.Fatalf("read back after reopening: %q %v", back, err)
	}
	// A plaintext home over that store is refused.
	p := newRig(t, raw, nil, nil)
	if err := p.RefuseIfEncrypted(ctx); !errors.Is(err, errdefs.ErrKey) {
		t.Fatalf("plaintext ring over an encrypted store: %v, want ErrKey", err)
	}
}

// A store that already holds plaintext data is never encrypted.
func TestSetUpRefusesPlaintextData(t *testing.T) {
	ctx := context.Background()
	raw := newStore(t)
	must(t, upload.PutBytes(ctx, raw, delta.RecordPrefix+"old", []byte("plaintext")))
	r := newRig(t, raw, nil, nil)
	must(t, r.RefuseIfEncrypted(ctx))
	kf, _ := newKeyFile(t)
	if err := r.SetUp(ctx, kf, false); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("setup over plaintext data: %v, want ErrPrecondition", err)
	}
	if r.Encrypted() || r.renewed != 0 || r.saved != nil {
		t.Fatal("a refused setup changed the ring")
	}
}

// Rotation rewraps the data key under the new master key on both tiers
// and deletes the old wrapping; the data key, and so every object, stays.
func TestRotate(t *testing.T) {
	ctx := context.Background()
	local, remote := newStore(t), newStore(t)
	r := newRig(t, local, remote, nil)
	if _, err := r.Rotate(ctx, "unused"); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("rotating a plaintext home: %v, want ErrPrecondition", err)
	}
	k1, id1 := newKeyFile(t)
	must(t, r.SetUp(ctx, k1, true))
	if !r.PlainLocal() || r.LocalKeys() != nil || r.remote == nil {
		t.Fatal("--encrypt-local=false: the local store is sealed, or no remote")
	}
	ids := r.IDs()
	if _, err := r.Rotate(ctx, k1); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("rotating to the current key: %v, want ErrInvalid", err)
	}
	k2, id2 := newKeyFile(t)
	rep, err := r.Rotate(ctx, k2)
	must(t, err)
	if rep.OldKey != id1 || rep.NewKey != id2 || r.KeyID() != id2 || r.saved.KeyID != id2 || !r.saved.PlainLocal {
		t.Fatalf("report %+v, key %s, saved %+v", rep, r.KeyID(), r.saved)
	}
	for _, s := range []upload.Store{local, remote} {
		if _, err := s.Stat(ctx, delta.KeyName(id1)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("old wrapping still there: %v", err)
		}
		if _, err := s.Stat(ctx, delta.KeyName(id2)); err != nil {
			t.Errorf("new wrapping missing: %v", err)
		}
	}
	// The remote alone opens the home with the new key.
	o := newRig(t, newStore(t), remote, r.saved)
	if o.IDs() != ids {
		t.Fatal("the rotated key opens another data key")
	}
}

// A failed setup puts the remote store and keys back.
func TestMarkRestores(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, newStore(t), nil, nil)
	restore := r.Mark()
	r.SetRemote(newStore(t))
	kf, _ := newKeyFile(t)
	must(t, r.SetUp(ctx, kf, false))
	if r.remote == nil || !r.Encrypted() {
		t.Fatal("setup did not take")
	}
	restore()
	if _, remote := r.Raw(); remote != nil || r.remote != nil || r.Encrypted() || r.PlainLocal() {
		t.Fatal("restore left the setup's remote or keys")
	}
}
