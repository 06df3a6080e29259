package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/engine/setup"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Config is HOME/config.json: how this home reaches its remote store.
// Credentials are never written here; they come from the environment or
// the AWS credentials file (see upload.S3Config).
type Config struct {
	// HomeID identifies this home among the homes sharing a bucket: it is
	// the Home of every sandbox created here, and prune deletes only the
	// checkpoints of those (docs/FORMAT.md, "Sandbox identity"). Made at
	// the first open of a home that has none.
	HomeID string        `json:"home_id,omitempty"`
	Remote *RemoteConfig `json:"remote,omitempty"`
	// Encryption, if set, names the master key of an encrypted store.
	Encryption *keys.Config `json:"encryption,omitempty"`
	// FrozenKeep is how many of each sandbox's newest checkpoints keep a
	// frozen layer on this host for cheap branches (overlay/frozen); nil
	// means frozen.DefaultKeep, 0 turns frozen layers off.
	FrozenKeep *int `json:"frozen_keep,omitempty"`
}

// RemoteConfig names an S3-compatible bucket and how uploads to it are
// paced (engine/setup).
type RemoteConfig = setup.RemoteConfig

// DefaultUploadConcurrency is how many uploads run at once by default.
const DefaultUploadConcurrency = remote.DefaultConcurrency

func (h home) configFile() string { return filepath.Join(string(h), "config.json") }

func loadConfig(h home) (*Config, error) {
	data, err := os.ReadFile(h.configFile())
	if errors.Is(err, os.ErrNotExist) {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("home %s: config: %w", h, err)
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("home %s: config %s: %v: %w", h, h.configFile(), err, errdefs.ErrInvalid)
	}
	return &c, nil
}

func saveConfig(h home, c *Config) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := h.configFile() + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("home %s: config: %w", h, err)
	}
	if err := os.Rename(tmp, h.configFile()); err != nil {
		return fmt.Errorf("home %s: config: %w", h, err)
	}
	return nil
}
