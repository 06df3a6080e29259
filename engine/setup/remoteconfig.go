package setup

import (
	"fmt"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

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

// S3Config translates the remote settings for package upload.
func (r *RemoteConfig) S3Config() (upload.S3Config, error) {
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
