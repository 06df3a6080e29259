// Package tenants is `turnsnap serve --tenants FILE`: one daemon serving
// several homes on one TCP listener. The tenants file (DecodeTenants)
// names each tenant's home, token, key and remote; TenantRouter picks a
// request's tenant by its bearer token; TenantGuard refuses what would
// reach outside the tenant's home; Serve opens every home with package
// server and serves them.
package tenants

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// TenantsFile is `turnsnap serve --tenants FILE`: the tenants one daemon
// serves, each a home of its own (its own catalog, store, key and bucket
// prefix) reached over the shared TCP listener with its own token.
//
//	{"tenants": [
//	  {"name": "alpha", "home": "/srv/turnsnap/alpha", "token_file": "/etc/turnsnap/alpha.token",
//	   "key_file": "/etc/turnsnap/alpha.key", "bases": "/srv/bases/alpha",
//	   "remote": {"url": "s3://bucket/alpha", "endpoint": "s3.example:9000"}}]}
type TenantsFile struct {
	Tenants []TenantSpec `json:"tenants"`
}

// TenantSpec is one tenant.
type TenantSpec struct {
	// Name names the tenant in logs and metrics (a sandbox-name-like word).
	Name string `json:"name"`
	// Home is the tenant's turnsnap home (absolute). No two tenants share
	// one, and no home lies inside another.
	Home string `json:"home"`
	// TokenFile holds the bearer token that acts for this tenant (at least
	// 16 characters, unique among the tenants).
	TokenFile string `json:"token_file"`
	// KeyFile, if set, is the tenant's master key: a plaintext home is
	// encrypted with it at start, an encrypted one must hold this key.
	KeyFile string `json:"key_file,omitempty"`
	// Remote, if set, is the tenant's bucket prefix: a home without a
	// remote is given it at start, one with a remote must have this one.
	Remote *engine.RemoteConfig `json:"remote,omitempty"`
	// Bases, if set, is the only directory the tenant's sandboxes may be
	// created from (a base must lie inside it).
	Bases string `json:"bases,omitempty"`
}

// Bounds of a tenants file: it is read by root at start, but it is still
// input and gets the treatment of any other decoder's.
const (
	MaxTenantsFileBytes = 1 << 20
	MaxTenants          = 256
	maxTenantPath       = 4096
)

// DecodeTenants parses and checks a tenants file: one JSON object, no
// unknown fields, at most MaxTenants tenants with unique names, absolute
// clean paths, no home equal to or inside another, no two remotes whose
// bucket prefixes overlap. Every error is ErrInvalid. What it cannot see
// from the file alone (the token files' contents, the homes' own remotes)
// CheckTenantTokens and CheckTenantRemotes check.
func DecodeTenants(data []byte) (*TenantsFile, error) {
	if len(data) > MaxTenantsFileBytes {
		return nil, fmt.Errorf("tenants file: over %d bytes: %w", MaxTenantsFileBytes, errdefs.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f TenantsFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("tenants file: %v: %w", err, errdefs.ErrInvalid)
	}
	if dec.More() {
		return nil, fmt.Errorf("tenants file: more than one JSON value: %w", errdefs.ErrInvalid)
	}
	if len(f.Tenants) == 0 {
		return nil, fmt.Errorf("tenants file: no tenants: %w", errdefs.ErrInvalid)
	}
	if len(f.Tenants) > MaxTenants {
		return nil, fmt.Errorf("tenants file: %d tenants, at most %d: %w", len(f.Tenants), MaxTenants, errdefs.ErrInvalid)
	}
	names := map[string]bool{}
	for i, t := range f.Tenants {
		if !delta.ValidRefName(t.Name) {
			return nil, fmt.Errorf("tenants file: tenant %d: name %q: %w", i+1, t.Name, errdefs.ErrInvalid)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("tenants file: tenant %s named twice: %w", t.Name, errdefs.ErrInvalid)
		}
		names[t.Name] = true
		for _, p := range []struct{ field, path string }{{"home", t.Home}, {"token_file", t.TokenFile}} {
			if p.path == "" {
				return nil, fmt.Errorf("tenants file: tenant %s: no %s: %w", t.Name, p.field, errdefs.ErrInvalid)
			}
		}
		for _, p := range []struct{ field, path string }{{"home", t.Home}, {"token_file", t.TokenFile},
			{"key_file", t.KeyFile}, {"bases", t.Bases}} {
			if p.path != "" && (len(p.path) > maxTenantPath || !filepath.IsAbs(p.path) || filepath.Clean(p.path) != p.path ||
				strings.ContainsRune(p.path, 0)) {
				return nil, fmt.Errorf("tenants file: tenant %s: %s %q is not a clean absolute path: %w", t.Name, p.field, p.path, errdefs.ErrInvalid)
			}
		}
		if t.Remote != nil {
			if _, err := upload.ParseS3URL(t.Remote.URL); err != nil {
				return nil, fmt.Errorf("tenants file: tenant %s: %v: %w", t.Name, err, errdefs.ErrInvalid)
			}
			if t.Remote.Endpoint == "" {
				return nil, fmt.Errorf("tenants file: tenant %s: remote %s has no endpoint: %w", t.Name, t.Remote.URL, errdefs.ErrInvalid)
			}
		}
	}
	for i, a := range f.Tenants {
		for _, b := range f.Tenants[i+1:] {
			if PathsOverlap(a.Home, b.Home) {
				return nil, fmt.Errorf("tenants file: tenants %s and %s: homes %s and %s are equal or nested (a tenant could reach the other's files): %w",
					a.Name, b.Name, a.Home, b.Home, errdefs.ErrInvalid)
			}
		}
	}
	for _, a := range f.Tenants {
		for _, b := range f.Tenants {
			if a.Bases != "" && within(a.Bases, b.Home) {
				return nil, fmt.Errorf("tenants file: tenant %s: bases %s lie in tenant %s's home (no sandbox may be made from a home): %w",
					a.Name, a.Bases, b.Name, errdefs.ErrInvalid)
			}
		}
	}
	remotes := map[string]*engine.RemoteConfig{}
	for _, t := range f.Tenants {
		remotes[t.Name] = t.Remote
	}
	if err := CheckTenantRemotes(f.Tenants, remotes); err != nil {
		return nil, err
	}
	return &f, nil
}

// PathsOverlap says whether two clean absolute paths are equal or one lies
// inside the other.
func PathsOverlap(a, b string) bool {
	return within(a, b) || within(b, a)
}

// within: p is dir or inside it.
func within(p, dir string) bool {
	if p == dir || dir == "/" {
		return true
	}
	return strings.HasPrefix(p, dir+"/")
}

// CheckTenantRemotes refuses two tenants whose remotes (name -> remote,
// nil: none) are in the same bucket with one prefix inside the other's:
// each would see, and gc could delete, the other's objects.
func CheckTenantRemotes(ts []TenantSpec, remotes map[string]*engine.RemoteConfig) error {
	type loc struct{ endpoint, bucket, prefix string }
	locs := map[string]loc{}
	for _, t := range ts {
		rc := remotes[t.Name]
		if rc == nil {
			continue
		}
		cfg, err := upload.ParseS3URL(rc.URL)
		if err != nil {
			return fmt.Errorf("tenant %s: %v: %w", t.Name, err, errdefs.ErrInvalid)
		}
		locs[t.Name] = loc{strings.ToLower(rc.Endpoint), cfg.Bucket, cfg.Prefix}
	}
	for i, a := range ts {
		la, ok := locs[a.Name]
		if !ok {
			continue
		}
		for _, b := range ts[i+1:] {
			lb, ok := locs[b.Name]
			if !ok || la.endpoint != lb.endpoint || la.bucket != lb.bucket {
				continue
			}
			// A plain string prefix, not whole segments: stricter than the
			// store needs ("team" and "team2" never share an object), so no
			// store's naming can make two tenants meet.
			if strings.HasPrefix(la.prefix, lb.prefix) || strings.HasPrefix(lb.prefix, la.prefix) {
				return fmt.Errorf("tenants %s and %s: remotes %s and %s share a bucket prefix (one tenant would read the other's objects): %w",
					a.Name, b.Name, remotes[a.Name].URL, remotes[b.Name].URL, errdefs.ErrInvalid)
			}
		}
	}
	return nil
}

// CheckTenantTokens refuses an empty or short token and a token two
// tenants share (tokens[i] is tenant i's).
func CheckTenantTokens(ts []TenantSpec, tokens [][]byte) error {
	for i, tok := range tokens {
		if len(tok) < MinTokenLen {
			return fmt.Errorf("tenant %s: token file %s: a token needs at least %d characters: %w",
				ts[i].Name, ts[i].TokenFile, MinTokenLen, errdefs.ErrInvalid)
		}
		for j := range i {
			if bytes.Equal(tokens[j], tok) {
				return fmt.Errorf("tenants %s and %s have the same token (a token names one tenant): %w",
					ts[j].Name, ts[i].Name, errdefs.ErrInvalid)
			}
		}
	}
	return nil
}

// MinTokenLen is the shortest bearer token accepted.
const MinTokenLen = 16

var errNotForTenants = errors.New("not available with a tenant's token")
