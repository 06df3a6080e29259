package tenants

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/server"
)

// Tenant is one tenant's handler on the shared listener.
type Tenant struct {
	Name    string
	Token   []byte
	Handler http.Handler
}

// TenantRouter serves several tenants on one listener: the bearer token
// picks the tenant's handler (its own engine), and a request without a
// tenant's token gets 401. The token is compared in constant time with
// every tenant's, on every request, with no early exit: the time a request
// takes does not tell which tenant (if any) a token is close to. Hashing
// first makes every comparison the same length, so not even a token's
// length leaks.
type TenantRouter struct {
	tenants []routedTenant
}

type routedTenant struct {
	name string
	sum  [sha256.Size]byte
	h    http.Handler
}

// NewTenantRouter routes to ts; tokens must be unique (CheckTenantTokens).
func NewTenantRouter(ts []Tenant) (*TenantRouter, error) {
	r := &TenantRouter{}
	for _, t := range ts {
		sum := sha256.Sum256(append([]byte("Bearer "), t.Token...))
		for _, o := range r.tenants {
			if o.sum == sum {
				return nil, fmt.Errorf("tenants %s and %s have the same token: %w", o.name, t.Name, errdefs.ErrInvalid)
			}
		}
		r.tenants = append(r.tenants, routedTenant{name: t.Name, sum: sum, h: t.Handler})
	}
	return r, nil
}

func (tr *TenantRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	match := 0 // index+1 of the matching tenant, 0 none
	for i := range tr.tenants {
		eq := subtle.ConstantTimeCompare(got[:], tr.tenants[i].sum[:])
		match = subtle.ConstantTimeSelect(eq, i+1, match)
	}
	if match == 0 {
		WriteUnauthorized(w)
		return
	}
	tr.tenants[match-1].h.ServeHTTP(w, r)
}

// WriteUnauthorized is the 401 of a missing or wrong bearer token.
func WriteUnauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="turnsnap"`)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusUnauthorized)
	fmt.Fprintf(w, `{"type":%q,"title":"unauthorized","status":401,"detail":"missing or wrong bearer token","class":"precondition"}`+"\n",
		api.ProblemType+"unauthorized")
}

// TenantGuard wraps a tenant's handler on the shared listener: the
// requests that would name something on the host outside the tenant are
// refused before they reach its engine.
//   - init (a key file or a remote named by the tenant: another tenant's
//     key or bucket prefix) is refused; the tenants file sets both.
//   - a sandbox's base must be a directory inside the tenant's Bases (if
//     set) and neither equal to, inside nor around any tenant's home
//     (checked after resolving symlinks), or a tenant could copy another's
//     sandbox roots, keys or catalog into a sandbox of its own.
//   - a btrfs pool is a host path too, and is refused.
type TenantGuard struct {
	Next    http.Handler
	Spec    TenantSpec
	Homes   []string // every tenant's home
	MaxBody int64
	mux     *http.ServeMux
}

// NewTenantGuard builds the guard; the same ServeMux patterns as the
// server's pick the guarded routes, so a path the server would route is
// guarded however it is spelt.
func NewTenantGuard(next http.Handler, spec TenantSpec, homes []string) *TenantGuard {
	g := &TenantGuard{Next: next, Spec: spec, Homes: homes, MaxBody: server.DefaultMaxBody, mux: http.NewServeMux()}
	g.mux.HandleFunc("POST /v1/init", func(w http.ResponseWriter, r *http.Request) {
		server.WriteProblem(w, fmt.Errorf("init for tenant %s: %w (the tenants file sets its key and remote): %w",
			spec.Name, errNotForTenants, errdefs.ErrPrecondition))
	})
	g.mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateRequest
		body, ok := g.peek(w, r, &req)
		if !ok {
			return
		}
		base, err := g.checkBase(req.Base, req.BtrfsPool)
		if err != nil {
			server.WriteProblem(w, err)
			return
		}
		if base != req.Base && strictDecodes(body, &api.CreateRequest{}) {
			// The engine gets the path that was checked, resolved, not the
			// spelling a symlink swapped in later could redirect.
			req.Base = base
			body, _ = json.Marshal(req)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		g.Next.ServeHTTP(w, r)
	})
	g.mux.HandleFunc("POST /v1/checkpoints/{ref}/branches", func(w http.ResponseWriter, r *http.Request) {
		var req api.BranchRequest
		if _, ok := g.peek(w, r, &req); !ok {
			return
		}
		if req.BtrfsPool != "" {
			server.WriteProblem(w, fmt.Errorf("branch for tenant %s: a btrfs pool is %w: %w", spec.Name, errNotForTenants, errdefs.ErrPrecondition))
			return
		}
		g.Next.ServeHTTP(w, r)
	})
	g.mux.Handle("/", next)
	return g
}

func (g *TenantGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }

// peek decodes the body as the server will (encoding/json, same struct)
// and puts it back. A body the server's strict decoder would refuse is
// passed on for it to refuse; one over the bound is refused here.
func (g *TenantGuard) peek(w http.ResponseWriter, r *http.Request, v any) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, g.MaxBody+1))
	if err != nil {
		server.WriteProblem(w, server.Invalidf("request body: %v", err))
		return nil, false
	}
	if int64(len(body)) > g.MaxBody {
		server.WriteProblem(w, server.Invalidf("request body over %d bytes", g.MaxBody))
		return nil, false
	}
	json.Unmarshal(body, v) // errors: the server refuses the same body
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}

// strictDecodes says whether the server's decoder accepts body: only then
// may the guard rewrite it (re-encoding one it would refuse, say with an
// unknown field, would make it acceptable).
func strictDecodes(body []byte, v any) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	return dec.Decode(v) == nil && !dec.More()
}

// checkBase returns base resolved (absolute, no symlinks), or why the
// tenant may not create from it.
func (g *TenantGuard) checkBase(base, pool string) (string, error) {
	name := g.Spec.Name
	if pool != "" {
		return "", fmt.Errorf("create for tenant %s: a btrfs pool is %w: %w", name, errNotForTenants, errdefs.ErrPrecondition)
	}
	if base == "" {
		return "", nil // the service refuses it with its own message
	}
	// One answer for every refusal: a path that does not exist, one outside
	// the tenant's bases and one in another tenant's home look the same, so
	// the answer tells nothing about the host's other tenants.
	refused := fmt.Errorf("base %s: no such directory for tenant %s: %w", base, name, errdefs.ErrNotFound)
	abs, err := filepath.Abs(base)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", refused
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return "", refused
	}
	if g.Spec.Bases != "" {
		root, err := filepath.EvalSymlinks(g.Spec.Bases)
		if err != nil || !within(abs, root) {
			return "", refused
		}
	}
	for _, h := range g.Homes {
		rh := h
		if r, err := filepath.EvalSymlinks(h); err == nil {
			rh = r
		}
		if PathsOverlap(abs, rh) {
			return "", refused
		}
	}
	return abs, nil
}
