package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/engine/remote"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
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

// RemoteConfig names an S3-compatible bucket and how uploads to it are paced.
type RemoteConfig struct {
	URL      string `json:"url"`      // s3://BUCKET[/PREFIX]
	Endpoint string `json:"endpoint"` // HOST:PORT
	Region   string `json:"region,omitempty"`
	Insecure bool   `json:"insecure,omitempty"` // plain HTTP (loopback, trusted networks)
	CAFile   string `json:"ca_file,omitempty"`
	// BandwidthBytes caps this host's upload rate (bytes/s); 0 = no cap.
	BandwidthBytes int64 `json:"bandwidth_bytes_per_sec,omitempty"`
	// Concurrency is how many uploads run at once; 0 = DefaultUploadConcurrency.
	Concurrency int `json:"concurrency,omitempty"`
	// LockStaleAfterNs is the stale window this home's bucket locks state
	// (docs/STORAGE.md): it refreshes them every third of it, and another
	// host ignores one not refreshed for that long. 0 =
	// delta.DefaultLockStaleAfter (1 minute).
	LockStaleAfterNs int64 `json:"lock_stale_after_ns,omitempty"`
}

// DefaultUploadConcurrency is how many uploads run at once by default.
const DefaultUploadConcurrency = remote.DefaultConcurrency

func (h home) configFile() string { return filepath.Join(string(h), "config.json") }

// s3Config translates the remote settings for package upload.
func (r *RemoteConfig) s3Config() (upload.S3Config, error) {
	cfg, err := upload.ParseS3URL(r.URL)
	if err != nil {
		return cfg, err
	}
	if r.Endpoint == "" {
		return cfg, fmt.Errorf("remote %s: no endpoint (HOST:PORT): %w", r.URL, errdefs.ErrInvalid)
	}
	cfg.Endpoint, cfg.Region, cfg.Insecure, cfg.CAFile = r.Endpoint, r.Region, r.Insecure, r.CAFile
	return cfg, nil
}

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
