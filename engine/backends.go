package engine

import (
	"encoding/json"
	"fmt"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// backend returns the backend called name configured by a sandbox's stored
// options cfg (delta.Sandbox.Config; nil for none). Backends without
// options are made once, at Open; the others are made here, which also
// checks their options.
func (e *Engine) backend(name string, cfg json.RawMessage) (rootfs.Backend, error) {
	if b, ok := e.backends[name]; ok {
		return b, nil
	}
	if name == btrfs.Name {
		var o btrfs.Options
		if len(cfg) > 0 {
			if err := json.Unmarshal(cfg, &o); err != nil {
				return nil, fmt.Errorf("btrfs options %s: %v: %w", cfg, err, errdefs.ErrCorrupt)
			}
		}
		o.Logger = e.log
		o.IDs = e.ids()
		return btrfs.NewBackend(o)
	}
	have := []string{btrfs.Name}
	for n := range e.backends {
		have = append(have, n)
	}
	return nil, fmt.Errorf("backend %q is not available (have: %v): %w", name, have, errdefs.ErrInvalid)
}

// backendConfig is the stored form of a backend's options: the JSON of
// btrfs.Options for btrfs, nothing for backends without options.
func backendConfig(name string, b btrfs.Options) (json.RawMessage, error) {
	if name != btrfs.Name {
		if b != (btrfs.Options{}) {
			return nil, fmt.Errorf("btrfs options given for backend %q: %w", name, errdefs.ErrInvalid)
		}
		return nil, nil
	}
	return json.Marshal(b)
}
