package tenants

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// FuzzDecodeTenants: the tenants file decoder never panics, fails only
// with ErrInvalid, and what it accepts keeps its promises (names unique,
// homes clean, absolute and apart) and survives a round trip.
func FuzzDecodeTenants(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"tenants":[]}`,
		`{"tenants":[{"name":"a","home":"/h/a","token_file":"/t/a"},{"name":"b","home":"/h/b","token_file":"/t/b","key_file":"/k/b","bases":"/b"}]}`,
		`{"tenants":[{"name":"a","home":"/h/a","token_file":"/t/a","remote":{"url":"s3://x/a","endpoint":"h:1"}},{"name":"b","home":"/h/b","token_file":"/t/b","remote":{"url":"s3://x/ab","endpoint":"h:1"}}]}`,
		`{"tenants":[{"name":"a","home":"/h","token_file":"/t"},{"name":"b","home":"/h/b","token_file":"/t"}]}`,
		`{"tenants":[{"name":"a","home":"/h/a","token_file":"/t/a","x":1}]}`, `{"tenants":null}`, `[]`, "\x00", `{"tenants":[{}]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		tf, err := DecodeTenants([]byte(data))
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("decode %q: %v is not ErrInvalid", data, err)
			}
			return
		}
		if len(tf.Tenants) == 0 || len(tf.Tenants) > MaxTenants {
			t.Fatalf("accepted %d tenants", len(tf.Tenants))
		}
		names := map[string]bool{}
		for i, a := range tf.Tenants {
			if names[a.Name] || a.TokenFile == "" || !strings.HasPrefix(a.Home, "/") {
				t.Fatalf("accepted %+v", a)
			}
			names[a.Name] = true
			for _, b := range tf.Tenants {
				if a.Bases != "" && within(a.Bases, b.Home) {
					t.Fatalf("accepted bases %s in home %s", a.Bases, b.Home)
				}
			}
			for _, b := range tf.Tenants[i+1:] {
				if PathsOverlap(a.Home, b.Home) {
					t.Fatalf("accepted nested homes %s and %s", a.Home, b.Home)
				}
			}
		}
		again, err := json.Marshal(tf)
		if err != nil {
			t.Fatal(err)
		}
		tf2, err := DecodeTenants(again)
		if err != nil || !reflect.DeepEqual(tf, tf2) {
			t.Fatalf("round trip of %q: %s -> %+v (%v)", data, again, tf2, err)
		}
	})
}

// The router sends each token to its tenant's handler and anything else
// (no header, another scheme, a near miss) to a 401; a shared token is
// refused when the router is built.
func TestTenantRouter(t *testing.T) {
	named := func(n string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(n)) })
	}
	toks := []string{"alpha-token-0123456789", "bravo-token-0123456789", "carol-token-0123456789"}
	var ts []Tenant
	for i, n := range []string{"alpha", "bravo", "carol"} {
		ts = append(ts, Tenant{Name: n, Token: []byte(toks[i]), Handler: named(n)})
	}
	tr, err := NewTenantRouter(ts)
	if err != nil {
		t.Fatal(err)
	}
	for auth, want := range map[string]string{
		"Bearer " + toks[0]: "alpha", "Bearer " + toks[1]: "bravo", "Bearer " + toks[2]: "carol",
		"": "", toks[0]: "", "Bearer " + toks[0] + "x": "", "Bearer " + toks[0][:len(toks[0])-1]: "", "Basic " + toks[1]: "",
		"bearer " + toks[2]: "",
	} {
		r := httptest.NewRequest("GET", "/v1/status", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		tr.ServeHTTP(w, r)
		if want == "" {
			if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "unauthorized") {
				t.Errorf("Authorization %q: HTTP %d %s, want 401", auth, w.Code, w.Body)
			}
		} else if w.Code != http.StatusOK || w.Body.String() != want {
			t.Errorf("Authorization %q: HTTP %d %q, want tenant %s", auth, w.Code, w.Body, want)
		}
	}
	ts[2].Token = ts[0].Token
	if _, err := NewTenantRouter(ts); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a shared token: %v", err)
	}
}

// The guard refuses init and btrfs pools, and bases outside the tenant's
// bases or in or around any home, the same 404 for each, however the path
// is spelt.
func TestTenantGuard(t *testing.T) {
	dir := t.TempDir()
	homes := []string{dir + "/homes/a", dir + "/homes/b"}
	for _, d := range append(homes, dir+"/bases/a/one", dir+"/bases/b") {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink(homes[1], dir+"/bases/a/to-b")
	os.Symlink("one", dir+"/bases/a/link")
	passed := 0
	var lastBody string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		passed++
		b, _ := io.ReadAll(r.Body)
		lastBody = string(b)
		w.WriteHeader(299)
	})
	g := NewTenantGuard(next, TenantSpec{Name: "a", Home: homes[0], Bases: dir + "/bases/a"}, homes)
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v1/init", `{"key_file":"/k"}`, http.StatusPreconditionFailed},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + dir + `/bases/a/one"}`, 299},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + dir + `/bases/a/one/../../b"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + dir + `/bases/b"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + dir + `/bases/a/to-b"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + homes[1] + `"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + homes[0] + `"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"/"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + dir + `/nope"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","BASE":"` + homes[1] + `"}`, http.StatusNotFound},
		{"POST", "/v1/sandboxes", `{"name":"x","base":"` + dir + `/bases/a/one","btrfs_pool":"/p"}`, http.StatusPreconditionFailed},
		{"POST", "/v1/checkpoints/abc/branches", `{"name":"x","btrfs_pool":"/p"}`, http.StatusPreconditionFailed},
		{"POST", "/v1/checkpoints/abc/branches", `{"name":"x"}`, 299},
		{"GET", "/v1/sandboxes", ``, 299},
	} {
		w := httptest.NewRecorder()
		g.ServeHTTP(w, httptest.NewRequest(c.method, c.path, strings.NewReader(c.body)))
		if w.Code != c.want {
			t.Errorf("%s %s %s: HTTP %d %s, want %d", c.method, c.path, c.body, w.Code, w.Body, c.want)
		}
	}
	if passed != 3 {
		t.Errorf("%d requests passed the guard, want 3", passed)
	}
	// The engine gets the path that was checked, resolved; a body the
	// server would refuse is passed on as it came.
	for body, want := range map[string]string{
		`{"name":"x","base":"` + dir + `/bases/a/link"}`:          `"base":"` + dir + `/bases/a/one"`,
		`{"name":"x","base":"` + dir + `/bases/a/link","evil":1}`: `"evil":1`,
	} {
		w := httptest.NewRecorder()
		g.ServeHTTP(w, httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(body)))
		if w.Code != 299 || !strings.Contains(lastBody, want) {
			t.Errorf("%s: HTTP %d, passed on %s, want it to hold %s", body, w.Code, lastBody, want)
		}
	}
}
