package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/content"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// EncryptionConfig says which master key opens this home's store. The key
// itself stays in its file; only the path and the key's public ID are
// kept in config.json.
type EncryptionConfig struct {
	KeyFile string `json:"key_file"`
	KeyID   string `json:"key_id"`
	// IDs is the content ID scheme (delta.SchemeKeyed for homes made since
	// keyed IDs). Absent means plain BLAKE3: an encrypted home made before
	// keyed IDs keeps the IDs its checkpoints have; it is never switched.
	// The store's key object says the same, and loadKeys checks they agree.
	IDs string `json:"ids,omitempty"`
	// PlainLocal says the local store and catalog are plaintext
	// (--encrypt-local=false): objects are sealed on their way to the
	// remote store and opened on their way back.
	PlainLocal bool `json:"plain_local,omitempty"`
}

// scheme is c's content ID scheme, "" read as plain.
func (c *EncryptionConfig) scheme() string {
	if c.IDs == "" {
		return delta.SchemePlain
	}
	return c.IDs
}

// idsField is the config value of k's scheme: "" for plain, so that an old
// home's config reads as it did.
func idsField(k *delta.Keys) string {
	if k.IDs().Keyed() {
		return delta.SchemeKeyed
	}
	return ""
}

// ReadKeyFile reads and parses a master key file. A key file anyone but its
// owner can read is refused: it opens every checkpoint of the store.
func ReadKeyFile(path string) (*delta.MasterKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %v: %w", path, err, errdefs.ErrKey)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key file %s: mode %o lets others read it; chmod 600: %w", path, fi.Mode().Perm(), errdefs.ErrKey)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %v: %w", path, err, errdefs.ErrKey)
	}
	m, err := delta.DecodeKeyFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// GenerateKeyFile writes a new master key to path (mode 0600). An existing
// file is never overwritten: it may be the only key to a store.
func GenerateKeyFile(path string) (string, error) {
	m := delta.GenerateMasterKey()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("key file %s: %w", path, errdefs.ErrExists)
	}
	if err != nil {
		return "", fmt.Errorf("key file %s: %w", path, err)
	}
	if _, err := f.Write(delta.EncodeKeyFile(m)); err != nil {
		f.Close()
		os.Remove(path)
		return "", fmt.Errorf("key file %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("key file %s: %w", path, err)
	}
	return m.ID(), f.Close()
}

// ids returns the home's content ID scheme: keyed BLAKE3 for an encrypted
// home made since keyed IDs, plain BLAKE3 otherwise (delta.Keys.IDs).
func (e *Engine) ids() delta.IDs { return e.keys.IDs() }

// IDs returns the home's content ID scheme, for code outside the engine
// that names content (the LLM journal).
func (e *Engine) IDs() delta.IDs { return e.ids() }

// PlainLocal reports whether this encrypted home keeps its local store
// and catalog in plaintext (--encrypt-local=false).
func (e *Engine) PlainLocal() bool { return e.plainLocal }

// localKeys returns the keys the local store and catalog are sealed with:
// nil for a plaintext home and for one whose local store is plaintext.
// Readers of the store's packs use them too: the remote of a plaintext-
// local home shows packs in the plaintext layout (upload.SealedRemote).
func (e *Engine) localKeys() *delta.Keys {
	if e.plainLocal {
		return nil
	}
	return e.keys
}

// newRepo returns the content repository over the engine's stores.
func (e *Engine) newRepo() *content.Repo {
	return content.NewSealedIDs(e.store, e.cat, e.codec, e.meter, e.localKeys(), e.ids())
}

func (e *Engine) catalogOptions(readOnly bool) catalog.Options {
	return catalog.Options{Logger: e.log, EncryptionKey: e.localKeys().CatalogKey(), ReadOnly: readOnly}
}

// loadKeys opens the data key named by the configuration, from the local
// store or else the remote one.
func (e *Engine) loadKeys(ctx context.Context) error {
	ec := e.config.Encryption
	if ec == nil {
		return nil
	}
	m, err := ReadKeyFile(ec.KeyFile)
	if err != nil {
		return fmt.Errorf("home %s is encrypted: %w", e.home, err)
	}
	if m.ID() != ec.KeyID {
		return fmt.Errorf("home %s is encrypted with key %s; key file %s holds key %s: %w",
			e.home, ec.KeyID, ec.KeyFile, m.ID(), errdefs.ErrKey)
	}
	k, _, err := e.findKeys(ctx, m)
	if err != nil {
		return err
	}
	if k == nil {
		return fmt.Errorf("home %s: key %s: no wrapped data key %s in the store: %w", e.home, m.ID(), delta.KeyName(m.ID()), errdefs.ErrKey)
	}
	if got := k.IDs().Scheme(); got != ec.scheme() {
		// Checking under the wrong scheme would fail every blob; say why.
		return fmt.Errorf("home %s: config.json names content IDs %q, the store's data key %s %q: %w",
			e.home, ec.scheme(), delta.KeyName(m.ID()), got, errdefs.ErrCorrupt)
	}
	e.keys = k
	return nil
}

// findKeys looks for the data key m wraps: locally, then remotely. It
// returns nil Keys, and the names of the key objects present, when m
// wraps none.
func (e *Engine) findKeys(ctx context.Context, m *delta.MasterKey) (*delta.Keys, []string, error) {
	name := delta.KeyName(m.ID())
	var others []string
	for _, s := range []upload.Store{e.local, e.remote} {
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
			for _, t := range []upload.Store{e.local, e.remote} {
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
		got, err := e.keyObjects(ctx, s)
		if err != nil {
			return nil, nil, err
		}
		others = append(others, got...)
	}
	return nil, others, nil
}

func (e *Engine) keyObjects(ctx context.Context, s upload.Store) ([]string, error) {
	var names []string
	err := s.List(ctx, delta.KeyPrefix, func(oi upload.ObjectInfo) error {
		names = append(names, oi.Name)
		return nil
	})
	return names, err
}

// wireStores wraps the raw stores for the engine's keys (nil keys: a
// plaintext store, whose wrapper refuses sealed objects with ErrKey).
func (e *Engine) wireStores(rawLocal, rawRemote upload.Store) {
	e.local = upload.Sealed(rawLocal, e.localKeys())
	e.remote = nil
	e.store = e.local
	if rawRemote != nil {
		if e.plainLocal && e.keys != nil {
			e.remote = upload.SealedRemote(rawRemote, e.keys)
		} else {
			e.remote = upload.Sealed(rawRemote, e.keys)
		}
		e.store = upload.NewTiered(e.local, e.remote)
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

// setUpEncryption makes keyFile's master key this home's. The store's
// existing data key is used when the key opens one (a second host, a
// rerun); otherwise a new store gets a new data key. A store that holds
// plaintext data, or whose data key this master key does not open, is
// refused.
func (e *Engine) setUpEncryption(ctx context.Context, keyFile string, plainLocal bool) error {
	abs, err := filepath.Abs(keyFile)
	if err != nil {
		return err
	}
	m, err := ReadKeyFile(abs)
	if err != nil {
		return err
	}
	if ec := e.config.Encryption; ec != nil {
		if ec.KeyID != m.ID() {
			return fmt.Errorf("home %s is encrypted with key %s, not %s (rotate with `turnsnap key rotate`): %w",
				e.home, ec.KeyID, m.ID(), errdefs.ErrKey)
		}
		if ec.PlainLocal != plainLocal {
			return fmt.Errorf("home %s: --encrypt-local=%v is chosen when a home is encrypted (objects are never rewritten): %w",
				e.home, !ec.PlainLocal, errdefs.ErrPrecondition)
		}
		return nil
	}
	rawLocal, rawRemote := e.rawStores()
	_, err = rawLocal.Stat(ctx, delta.KeyName(m.ID()))
	localHadKey := err == nil
	k, others, err := e.findKeys(ctx, m)
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
				e.home, errdefs.ErrPrecondition)
		}
	}
	if has, err := holdsData(ctx, rawLocal); err != nil {
		return err
	} else if has && !localHadKey {
		// The bucket is encrypted but this home's own data is not.
		return fmt.Errorf("home %s: the local store holds unencrypted checkpoints and the remote store is encrypted: %w", e.home, errdefs.ErrPrecondition)
	}
	if k != nil && plainLocal && !k.IDs().Keyed() {
		// A plaintext pack's name goes to the bucket; only a keyed ID
		// makes that safe.
		return fmt.Errorf("home %s: --encrypt-local=false needs keyed content IDs, and this store was made before them: %w", e.home, errdefs.ErrPrecondition)
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
	// The catalog of an empty home holds nothing the store does not; it
	// is made again, encrypted.
	if err := e.cat.Close(); err != nil {
		return err
	}
	e.cat = nil
	if err := os.RemoveAll(e.home.catalogDir()); err != nil {
		return err
	}
	e.keys, e.plainLocal = k, plainLocal
	setBackendIDs(e.backends, e.ids())
	if e.cat, err = catalog.Open(ctx, e.home.catalogDir(), e.catalogOptions(false)); err != nil {
		return err
	}
	c := *e.config
	// The scheme is the store's (its key object's): a second host joining
	// a store made before keyed IDs keeps plain ones.
	c.Encryption = &EncryptionConfig{KeyFile: abs, KeyID: m.ID(), IDs: idsField(k), PlainLocal: plainLocal}
	if err := saveConfig(e.home, &c); err != nil {
		return err
	}
	e.config = &c
	e.wireStores(rawLocal, rawRemote)
	return nil
}

// rawStores returns the stores beneath the sealing wrappers.
func (e *Engine) rawStores() (upload.Store, upload.Store) { return e.rawLocal, e.rawRemote }

// refuseIfEncrypted fails with ErrKey when this home has no key but the
// store it reads holds wrapped data keys.
func (e *Engine) refuseIfEncrypted(ctx context.Context) error {
	if e.keys != nil {
		return nil
	}
	for _, s := range []upload.Store{e.rawLocal, e.rawRemote} {
		if s == nil {
			continue
		}
		names, err := e.keyObjects(ctx, s)
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

// RotateReport says what RotateKey did.
type RotateReport struct {
	OldKey, NewKey string
}

// RotateKey makes newKeyFile's master key the one that opens this home's
// store: the data key is wrapped again under the new master key (on the
// remote store first, then locally), the configuration switches to it, and
// the old wrapping is deleted. No data object is rewritten, so it costs a
// few small writes whatever the store holds.
func (e *Engine) RotateKey(ctx context.Context, newKeyFile string) (*RotateReport, error) {
	defer e.exclusive()()
	if e.keys == nil {
		return nil, fmt.Errorf("home %s is not encrypted: %w", e.home, errdefs.ErrPrecondition)
	}
	abs, err := filepath.Abs(newKeyFile)
	if err != nil {
		return nil, err
	}
	m, err := ReadKeyFile(abs)
	if err != nil {
		return nil, err
	}
	old := e.config.Encryption.KeyID
	if m.ID() == old {
		return nil, fmt.Errorf("key file %s holds the current key %s: %w", abs, old, errdefs.ErrInvalid)
	}
	obj := m.WrapKeys(e.keys)
	for _, s := range []upload.Store{e.rawRemote, e.rawLocal} {
		if s != nil {
			if err := upload.PutBytes(ctx, s, delta.KeyName(m.ID()), obj); err != nil {
				return nil, fmt.Errorf("object %s: %w", delta.KeyName(m.ID()), err)
			}
		}
	}
	c := *e.config
	c.Encryption = &EncryptionConfig{KeyFile: abs, KeyID: m.ID(), IDs: e.config.Encryption.IDs, PlainLocal: e.plainLocal}
	if err := saveConfig(e.home, &c); err != nil {
		return nil, err
	}
	e.config = &c
	for _, s := range []upload.Store{e.rawRemote, e.rawLocal} {
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
func (e *Engine) KeyID() string {
	if e.config.Encryption == nil {
		return ""
	}
	return e.config.Encryption.KeyID
}
