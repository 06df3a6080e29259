package keys

import (
	"errors"
	"fmt"
	"os"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Config says which master key opens this home's store (config.json's
// "encryption"). The key itself stays in its file; only the path and the
// key's public ID are kept in config.json.
type Config struct {
	KeyFile string `json:"key_file"`
	KeyID   string `json:"key_id"`
	// IDs is the content ID scheme (delta.SchemeKeyed for homes made since
	// keyed IDs). Absent means plain BLAKE3: an encrypted home made before
	// keyed IDs keeps the IDs its checkpoints have; it is never switched.
	// The store's key object says the same, and Load checks they agree.
	IDs string `json:"ids,omitempty"`
	// PlainLocal says the local store and catalog are plaintext
	// (--encrypt-local=false): objects are sealed on their way to the
	// remote store and opened on their way back.
	PlainLocal bool `json:"plain_local,omitempty"`
}

// scheme is c's content ID scheme, "" read as plain.
func (c *Config) scheme() string {
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
