// Package keys is a home's encryption: its master key files, the data key
// they wrap, the sealing wrappers over the home's stores, setting up
// encryption and rotating the master key (docs/SECURITY.md).
package keys

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Deps is what a Ring needs of the engine that owns it.
type Deps struct {
	// Home names the home in errors.
	Home string
	// Local and Remote are the raw stores, beneath the sealing wrappers;
	// Remote is nil without a remote (SetRemote gives one later).
	Local, Remote upload.Store
	// Config is the home's encryption configuration, nil for a plaintext
	// home.
	Config *Config
	// Save writes c as the home's encryption configuration (config.json)
	// and makes it the engine's.
	Save func(c *Config) error
	// Wired is told the sealed stores each time they change: the local
	// one, the remote one (nil without a remote), and the store the
	// engine reads and writes (the local one, or with a remote the local
	// one in front of the remote one).
	Wired func(local, remote, store upload.Store)
	// Renew is called when SetUp has made a home encrypted, with the new
	// keys in place: the engine remakes its catalog under them (the
	// catalog of an empty home holds nothing the store does not) and
	// passes the new ID scheme on.
	Renew func(ctx context.Context) error
	// Exclusive takes the engine's maintenance lock for Rotate: no turn
	// runs while the key changes.
	Exclusive func() (release func())
}

// Ring owns a home's keys: the data key (nil for a plaintext home), whether
// the local store and catalog are plaintext (--encrypt-local=false: only
// the remote is sealed), and the raw stores the sealing wrappers go over.
type Ring struct {
	d Deps
	// rawLocal and rawRemote are the stores beneath the sealing wrappers;
	// local and remote are the wrapped ones (the raw ones until Load).
	rawLocal, rawRemote upload.Store
	local, remote       upload.Store
	keys                *delta.Keys
	plainLocal          bool
	config              *Config
}

// New returns the ring of a home with d's stores and configuration. Load
// opens its data key.
func New(d Deps) *Ring {
	return &Ring{d: d, rawLocal: d.Local, rawRemote: d.Remote, local: d.Local, remote: d.Remote,
		config: d.Config, plainLocal: d.Config != nil && d.Config.PlainLocal}
}

// IDs returns the home's content ID scheme: keyed BLAKE3 for an encrypted
// home made since keyed IDs, plain BLAKE3 otherwise (delta.Keys.IDs).
func (r *Ring) IDs() delta.IDs { return r.keys.IDs() }

// Encrypted reports whether the home has a data key.
func (r *Ring) Encrypted() bool { return r.keys != nil }

// PlainLocal reports whether this encrypted home keeps its local store
// and catalog in plaintext (--encrypt-local=false).
func (r *Ring) PlainLocal() bool { return r.plainLocal }

// LocalKeys returns the keys the local store and catalog are sealed with:
// nil for a plaintext home and for one whose local store is plaintext.
// Readers of the store's packs use them too: the remote of a plaintext-
// local home shows packs in the plaintext layout (upload.SealedRemote).
func (r *Ring) LocalKeys() *delta.Keys {
	if r.plainLocal {
		return nil
	}
	return r.keys
}

// Load opens the data key named by the configuration, from the local
// store or else the remote one, and wires the sealed stores.
func (r *Ring) Load(ctx context.Context) error {
	if err := r.load(ctx); err != nil {
		return err
	}
	r.wire()
	return nil
}

func (r *Ring) load(ctx context.Context) error {
	ec := r.config
	if ec == nil {
		return nil
	}
	m, err := ReadKeyFile(ec.KeyFile)
	if err != nil {
		return fmt.Errorf("home %s is encrypted: %w", r.d.Home, err)
	}
	if m.ID() != ec.KeyID {
		return fmt.Errorf("home %s is encrypted with key %s; key file %s holds key %s: %w",
			r.d.Home, ec.KeyID, ec.KeyFile, m.ID(), errdefs.ErrKey)
	}
	k, _, err := r.findKeys(ctx, m)
	if err != nil {
		return err
	}
	if k == nil {
		return fmt.Errorf("home %s: key %s: no wrapped data key %s in the store: %w", r.d.Home, m.ID(), delta.KeyName(m.ID()), errdefs.ErrKey)
	}
	if got := k.IDs().Scheme(); got != ec.scheme() {
		// Checking under the wrong scheme would fail every blob; say why.
		return fmt.Errorf("home %s: config.json names content IDs %q, the store's data key %s %q: %w",
			r.d.Home, ec.scheme(), delta.KeyName(m.ID()), got, errdefs.ErrCorrupt)
	}
	r.keys = k
	return nil
}

// findKeys looks for the data key m wraps: locally, then remotely. It
// returns nil Keys, and the names of the key objects present, when m
// wraps none.
func (r *Ring) findKeys(ctx context.Context, m *delta.MasterKey) (*delta.Keys, []string, error) {
	name := delta.KeyName(m.ID())
	var others []string
	for _, s := range []upload.Store{r.local, r.remote} {
		if s == nil {
			continue
		}
		data, err := upload.ReadAll(ctx, s, name)
		if err == nil {
			k, err := m.UnwrapKeys(data)
			if err != nil {
				return nil, nil, fmt.Errorf("object %s: %w", name, err)
			}
			// Keep a copy on every tier, so either alone opens the store.
			for _, t := range []upload.Store{r.local, r.remote} {
				if t != nil && t != s {
					if _, err := t.Stat(ctx, name); errors.Is(err, errdefs.ErrNotFound) {
						if err := upload.PutBytes(ctx, t, name, data); err != nil {
							return nil, nil, fmt.Errorf("object %s: %w", name, err)
						}
					}
				}
			}
			return k, nil, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, nil, err
		}
		got, err := keyObjects(ctx, s)
		if err != nil {
			return nil, nil, err
		}
		others = append(others, got...)
	}
	return nil, others, nil
}

func keyObjects(ctx context.Context, s upload.Store) ([]string, error) {
	var names []string
	err := s.List(ctx, delta.KeyPrefix, func(oi upload.ObjectInfo) error {
		names = append(names, oi.Name)
		return nil
	})
	return names, err
}

// wire wraps the raw stores for the ring's keys (nil keys: a plaintext
// store, whose wrapper refuses sealed objects with ErrKey) and tells the
// engine.
func (r *Ring) wire() {
	r.local = upload.Sealed(r.rawLocal, r.LocalKeys())
	r.remote = nil
	store := r.local
	if r.rawRemote != nil {
		if r.plainLocal && r.keys != nil {
			r.remote = upload.SealedRemote(r.rawRemote, r.keys)
		} else {
			r.remote = upload.Sealed(r.rawRemote, r.keys)
		}
		store = upload.NewTiered(r.local, r.remote)
	}
	if r.d.Wired != nil {
		r.d.Wired(r.local, r.remote, store)
	}
}

// SetRemote makes raw the home's remote store (beneath its sealing
// wrapper) and wires the stores again.
func (r *Ring) SetRemote(raw upload.Store) {
	r.rawRemote = raw
	r.wire()
}

// Mark remembers the ring's remote store and keys; the function it
// returns puts them back and wires the stores again, for a setup that
// fails: the remote is the home's only once its queue and config are
// saved.
func (r *Ring) Mark() (restore func()) {
	raw, k, plain := r.rawRemote, r.keys, r.plainLocal
	return func() {
		r.rawRemote, r.keys, r.plainLocal = raw, k, plain
		r.wire()
	}
}

// holdsData reports whether s has any pack or record: a store that does is
// plaintext for good (encryption never rewrites objects).
func holdsData(ctx context.Context, s upload.Store) (bool, error) {
	found := errors.New("found")
	for _, p := range []string{delta.PackPrefix, delta.RecordPrefix} {
		err := s.List(ctx, p, func(upload.ObjectInfo) error { return found })
		if err == found {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
	return false, nil
}

// SetUp makes keyFile's master key this home's. The store's
// existing data key is used when the key opens one (a second host, a
// rerun); otherwise a new store gets a new data key. A store that holds
// plaintext data, or whose data key this master key does not open, is
// refused.
func (r *Ring) SetUp(ctx context.Context, keyFile string, plainLocal bool) error {
	abs, err := filepath.Abs(keyFile)
	if err != nil {
		return err
	}
	m, err := ReadKeyFile(abs)
	if err != nil {
		return err
	}
	if ec := r.config; ec != nil {
		if ec.KeyID != m.ID() {
			return fmt.Errorf("home %s is encrypted with key %s, not %s (rotate with `turnsnap key rotate`): %w",
				r.d.Home, ec.KeyID, m.ID(), errdefs.ErrKey)
		}
		if ec.PlainLocal != plainLocal {
			return fmt.Errorf("home %s: --encrypt-local=%v is chosen when a home is encrypted (objects are never rewritten): %w",
				r.d.Home, !ec.PlainLocal, errdefs.ErrPrecondition)
		}
		return nil
	}
	rawLocal, rawRemote := r.Raw()
	_, err = rawLocal.Stat(ctx, delta.KeyName(m.ID()))
	localHadKey := err == nil
	k, others, err := r.findKeys(ctx, m)
	if err != nil {
		return err
	}
	if k == nil && len(others) > 0 {
		return fmt.Errorf("the store is encrypted with another key (%s); key file %s holds key %s: %w",
			strings.Join(others, ", "), abs, m.ID(), errdefs.ErrKey)
	}
	for _, s := range []upload.Store{rawLocal, rawRemote} {
		if s == nil {
			continue
		}
		if has, err := holdsData(ctx, s); err != nil {
			return err
		} else if has && k == nil {
			return fmt.Errorf("home %s: the store already holds unencrypted checkpoints; encryption is chosen when a store is created (objects are never rewritten): %w",
				r.d.Home, errdefs.ErrPrecondition)
		}
	}
	if has, err := holdsData(ctx, rawLocal); err != nil {
		return err
	} else if has && !localHadKey {
		// The bucket is encrypted but this home's own data is not.
		return fmt.Errorf("home %s: the local store holds unencrypted checkpoints and the remote store is encrypted: %w", r.d.Home, errdefs.ErrPrecondition)
	}
	if k != nil && plainLocal && !k.IDs().Keyed() {
		// A plaintext pack's name goes to the bucket; only a keyed ID
		// makes that safe.
		return fmt.Errorf("home %s: --encrypt-local=false needs keyed content IDs, and this store was made before them: %w", r.d.Home, errdefs.ErrPrecondition)
	}
	if k == nil {
		k = delta.NewDataKey()
		obj := m.WrapKeys(k)
		// Remote first: the bucket is what another host will look in.
		for _, s := range []upload.Store{rawRemote, rawLocal} {
			if s != nil {
				if err := upload.PutBytes(ctx, s, delta.KeyName(m.ID()), obj); err != nil {
					return fmt.Errorf("object %s: %w", delta.KeyName(m.ID()), err)
				}
			}
		}
	}
	// The engine makes its catalog again, encrypted (Deps.Renew).
	r.keys, r.plainLocal = k, plainLocal
	if err := r.d.Renew(ctx); err != nil {
		return err
	}
	// The scheme is the store's (its key object's): a second host joining
	// a store made before keyed IDs keeps plain ones.
	c := &Config{KeyFile: abs, KeyID: m.ID(), IDs: idsField(k), PlainLocal: plainLocal}
	if err := r.d.Save(c); err != nil {
		return err
	}
	r.config = c
	r.wire()
	return nil
}

// Raw returns the stores beneath the sealing wrappers (the remote one nil
// without a remote).
func (r *Ring) Raw() (local, remote upload.Store) { return r.rawLocal, r.rawRemote }

// RefuseIfEncrypted fails with ErrKey when this home has no key but the
// store it reads holds wrapped data keys.
func (r *Ring) RefuseIfEncrypted(ctx context.Context) error {
	if r.keys != nil {
		return nil
	}
	for _, s := range []upload.Store{r.rawLocal, r.rawRemote} {
		if s == nil {
			continue
		}
		names, err := keyObjects(ctx, s)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("the store is encrypted (%s); give its key with `turnsnap init --key-file PATH`: %w",
				strings.Join(names, ", "), errdefs.ErrKey)
		}
	}
	return nil
}

// RotateReport says what Rotate did.
type RotateReport struct {
	OldKey, NewKey string
}

// Rotate makes newKeyFile's master key the one that opens this home's
// store: the data key is wrapped again under the new master key (on the
// remote store first, then locally), the configuration switches to it, and
// the old wrapping is deleted. No data object is rewritten, so it costs a
// few small writes whatever the store holds.
func (r *Ring) Rotate(ctx context.Context, newKeyFile string) (*RotateReport, error) {
	defer r.d.Exclusive()()
	if r.keys == nil {
		return nil, fmt.Errorf("home %s is not encrypted: %w", r.d.Home, errdefs.ErrPrecondition)
	}
	abs, err := filepath.Abs(newKeyFile)
	if err != nil {
		return nil, err
	}
	m, err := ReadKeyFile(abs)
	if err != nil {
		return nil, err
	}
	old := r.config.KeyID
	if m.ID() == old {
		return nil, fmt.Errorf("key file %s holds the current key %s: %w", abs, old, errdefs.ErrInvalid)
	}
	obj := m.WrapKeys(r.keys)
	for _, s := range []upload.Store{r.rawRemote, r.rawLocal} {
		if s != nil {
			if err := upload.PutBytes(ctx, s, delta.KeyName(m.ID()), obj); err != nil {
				return nil, fmt.Errorf("object %s: %w", delta.KeyName(m.ID()), err)
			}
		}
	}
	c := &Config{KeyFile: abs, KeyID: m.ID(), IDs: r.config.IDs, PlainLocal: r.plainLocal}
	if err := r.d.Save(c); err != nil {
		return nil, err
	}
	r.config = c
	for _, s := range []upload.Store{r.rawRemote, r.rawLocal} {
		if s != nil {
			if err := s.Delete(ctx, delta.KeyName(old)); err != nil {
				return nil, fmt.Errorf("object %s: %w", delta.KeyName(old), err)
			}
		}
	}
	return &RotateReport{OldKey: old, NewKey: m.ID()}, nil
}

// KeyID returns the ID of the master key opening this home's store, or ""
// for a plaintext home.
func (r *Ring) KeyID() string {
	if r.config == nil {
		return ""
	}
	return r.config.KeyID
}
