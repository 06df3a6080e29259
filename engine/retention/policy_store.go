package retention

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
)

// Policies is HOME/retention.json: the retention policy of the home and of
// single sandboxes, which ApplyPolicies carries out. A sandbox's own policy
// replaces the home's for it (no rule of the home's is merged in).
type Policies struct {
	Version int     `json:"version"` // policiesVersion
	Home    *Policy `json:"home,omitempty"`
	// Sandboxes maps a sandbox's key (its id; a legacy sandbox's name) to
	// its policy, so a sandbox removed and made again under the same name
	// does not inherit the old one's.
	Sandboxes map[string]Policy `json:"sandboxes,omitempty"`
}

const (
	policiesVersion = 1
	// MaxPoliciesSize bounds HOME/retention.json: a policy is a few
	// dozen bytes, so 1 MiB is thousands of sandboxes.
	MaxPoliciesSize = 1 << 20
	maxPolicies     = 10000
)

func (rt *Retention) policiesFile() string { return filepath.Join(rt.d.Home, "retention.json") }

// DecodePolicies parses the bytes of HOME/retention.json strictly: at most
// MaxPoliciesSize, no unknown fields or trailing data, a known version,
// every policy valid and every key a sandbox id or name. Anything else is
// ErrCorrupt (the file is turnsnap's own, written whole).
func DecodePolicies(data []byte) (*Policies, error) {
	if len(data) > MaxPoliciesSize {
		return nil, fmt.Errorf("retention policies: %d bytes, more than the limit %d: %w", len(data), MaxPoliciesSize, errdefs.ErrCorrupt)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	p := new(Policies)
	if err := dec.Decode(p); err != nil {
		return nil, fmt.Errorf("retention policies: %v: %w", err, errdefs.ErrCorrupt)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("retention policies: trailing data: %w", errdefs.ErrCorrupt)
	}
	if p.Version != policiesVersion {
		return nil, fmt.Errorf("retention policies: version %d, this turnsnap reads %d: %w", p.Version, policiesVersion, errdefs.ErrCorrupt)
	}
	if len(p.Sandboxes) > maxPolicies {
		return nil, fmt.Errorf("retention policies: %d sandboxes, at most %d: %w", len(p.Sandboxes), maxPolicies, errdefs.ErrCorrupt)
	}
	check := func(who string, rp Policy) error {
		if err := rp.Validate(); err != nil {
			return fmt.Errorf("retention policies: %s: %v: %w", who, errors.Unwrap(err), errdefs.ErrCorrupt)
		}
		return nil
	}
	if p.Home != nil {
		if err := check("home", *p.Home); err != nil {
			return nil, err
		}
	}
	for k, rp := range p.Sandboxes {
		if !delta.ValidSandboxID(k) && !delta.ValidRefName(k) {
			return nil, fmt.Errorf("retention policies: sandbox key %q is not valid: %w", k, errdefs.ErrCorrupt)
		}
		if err := check("sandbox "+k, rp); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// loadPolicies reads the home's policies; a home without the file has none.
func (rt *Retention) loadPolicies() (*Policies, error) {
	f, err := os.Open(rt.policiesFile())
	if errors.Is(err, os.ErrNotExist) {
		return &Policies{Version: policiesVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("home %s: retention policies: %w", rt.d.Home, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxPoliciesSize+1))
	if err != nil {
		return nil, fmt.Errorf("home %s: retention policies: %w", rt.d.Home, err)
	}
	p, err := DecodePolicies(data)
	if err != nil {
		return nil, fmt.Errorf("home %s: %w", rt.d.Home, err)
	}
	return p, nil
}

// savePolicies writes the file whole: a temporary file, fsync, rename, and
// an fsync of the home, so a crash leaves the old policies or the new.
func (rt *Retention) savePolicies(p *Policies) error {
	p.Version = policiesVersion
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	path := rt.policiesFile()
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("home %s: retention policies: %w", rt.d.Home, err)
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = fsat.SyncDir(rt.d.Home)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("home %s: retention policies: %w", rt.d.Home, err)
	}
	return nil
}
