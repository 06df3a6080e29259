package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Every start-up refusal of serve --tenants: each exits 2 naming the
// problem, before any home is opened (no home, no socket is made).
func TestTenantsFileRules(t *testing.T) {
	testenv.RequireRoot(t)
	listen := []string{"--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		name  string
		edit  func(t *testing.T, fx *tenantsFixture)
		raw   string // the file's text, instead of fx's
		flags []string
		want  string
	}{
		{name: "equal homes", edit: func(_ *testing.T, fx *tenantsFixture) { fx.specs[1].Home = fx.specs[0].Home }, want: "equal or nested"},
		{name: "nested homes", edit: func(_ *testing.T, fx *tenantsFixture) {
			fx.specs[1].Home = filepath.Join(fx.specs[0].Home, "inner")
		}, want: "equal or nested"},
		{name: "home around another", edit: func(_ *testing.T, fx *tenantsFixture) { fx.specs[0].Home = fx.dir }, want: "equal or nested"},
		{name: "bases in a home", edit: func(_ *testing.T, fx *tenantsFixture) {
			fx.specs[0].Bases = filepath.Join(fx.specs[1].Home, "sandboxes")
		}, want: "lie in tenant b's home"},
		{name: "shared token", edit: func(t *testing.T, fx *tenantsFixture) {
			os.WriteFile(fx.specs[1].TokenFile, []byte(fx.tokens[0]+"\n"), 0o600)
		}, want: "same token"},
		{name: "same token file", edit: func(_ *testing.T, fx *tenantsFixture) { fx.specs[1].TokenFile = fx.specs[0].TokenFile }, want: "same token"},
		{name: "missing token file", edit: func(_ *testing.T, fx *tenantsFixture) { os.Remove(fx.specs[1].TokenFile) }, want: "token file"},
		{name: "empty token file", edit: func(_ *testing.T, fx *tenantsFixture) { os.WriteFile(fx.specs[1].TokenFile, []byte("\n\n"), 0o600) },
			want: "at least 16"},
		{name: "endless token file", edit: func(_ *testing.T, fx *tenantsFixture) { fx.specs[1].TokenFile = "/dev/zero" }, want: "over 4096 bytes"},
		{name: "no token file named", edit: func(_ *testing.T, fx *tenantsFixture) { fx.specs[0].TokenFile = "" }, want: "no token_file"},
		{name: "no listen", flags: []string{}, want: "needs --listen"},
		{name: "llm proxy as well", flags: append([]string{"--llm-listen", "127.0.0.1:0"}, listen...), want: "cannot tell tenants apart"},
		{name: "token-file as well", flags: append([]string{"--token-file", "/etc/hostname"}, listen...), want: "each tenant has its token_file"},
		{name: "non-loopback without TLS", flags: []string{"--listen", "0.0.0.0:0"}, want: "without TLS"},
		{name: "remote prefix inside another", edit: func(_ *testing.T, fx *tenantsFixture) {
			fx.specs[0].Remote = &engine.RemoteConfig{URL: "s3://bkt/team", Endpoint: "127.0.0.1:1"}
			fx.specs[1].Remote = &engine.RemoteConfig{URL: "s3://bkt/team/b", Endpoint: "127.0.0.1:1"}
		}, want: "share a bucket prefix"},
		{name: "same remote", edit: func(_ *testing.T, fx *tenantsFixture) {
			fx.specs[0].Remote = &engine.RemoteConfig{URL: "s3://bkt/x", Endpoint: "127.0.0.1:1"}
			fx.specs[1].Remote = &engine.RemoteConfig{URL: "s3://bkt/x/", Endpoint: "127.0.0.1:1"}
		}, want: "share a bucket prefix"},
		{name: "bucket root and a prefix", edit: func(_ *testing.T, fx *tenantsFixture) {
			fx.specs[0].Remote = &engine.RemoteConfig{URL: "s3://bkt", Endpoint: "127.0.0.1:1"}
			fx.specs[1].Remote = &engine.RemoteConfig{URL: "s3://bkt/b", Endpoint: "127.0.0.1:1"}
		}, want: "share a bucket prefix"},
		{name: "a home's own remote overlaps", edit: func(t *testing.T, fx *tenantsFixture) {
			fx.specs[0].Remote = &engine.RemoteConfig{URL: "s3://bkt/shared", Endpoint: "127.0.0.1:1"}
			os.MkdirAll(fx.specs[1].Home, 0o700)
			os.WriteFile(filepath.Join(fx.specs[1].Home, "config.json"),
				[]byte(`{"remote":{"url":"s3://bkt/shared","endpoint":"127.0.0.1:1"}}`), 0o600)
		}, want: "share a bucket prefix"},
		{name: "a home's remote differs from the file", edit: func(t *testing.T, fx *tenantsFixture) {
			fx.specs[1].Remote = &engine.RemoteConfig{URL: "s3://bkt/mine", Endpoint: "127.0.0.1:1"}
			os.MkdirAll(fx.specs[1].Home, 0o700)
			os.WriteFile(filepath.Join(fx.specs[1].Home, "config.json"),
				[]byte(`{"remote":{"url":"s3://bkt/other","endpoint":"127.0.0.1:1"}}`), 0o600)
		}, want: "the tenants file says"},
		{name: "unknown field", raw: `{"tenants":[{"name":"a","home":"/x/a","token_file":"/x/t","admin":true}]}`, want: "unknown field"},
		{name: "unknown remote field", raw: `{"tenants":[{"name":"a","home":"/x/a","token_file":"/x/t","remote":{"url":"s3://b/a","endpoint":"h:1","secret":"k"}}]}`,
			want: "unknown field"},
		{name: "unknown top-level field", raw: `{"tenants":[],"default":"a"}`, want: "unknown field"},
		{name: "two values", raw: `{"tenants":[{"name":"a","home":"/x/a","token_file":"/x/t"}]} {}`, want: "more than one JSON value"},
		{name: "no tenants", raw: `{"tenants":[]}`, want: "no tenants"},
		{name: "relative home", raw: `{"tenants":[{"name":"a","home":"x/a","token_file":"/x/t"}]}`, want: "clean absolute path"},
		{name: "unclean home", raw: `{"tenants":[{"name":"a","home":"/x/../a","token_file":"/x/t"}]}`, want: "clean absolute path"},
		{name: "bad name", raw: `{"tenants":[{"name":"../a","home":"/x/a","token_file":"/x/t"}]}`, want: "name"},
		{name: "a name twice", edit: func(_ *testing.T, fx *tenantsFixture) { fx.specs[1].Name = fx.specs[0].Name }, want: "named twice"},
		{name: "oversized file", raw: `{"tenants":[` + strings.Repeat(" ", 1<<20) + `]}`, want: "over"},
		{name: "missing file", raw: "-", want: "--tenants"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newTenants(t, t.TempDir(), "a", "b")
			if tc.edit != nil {
				tc.edit(t, fx)
			}
			fx.write(t)
			switch tc.raw {
			case "":
			case "-":
				os.Remove(fx.file)
			default:
				os.WriteFile(fx.file, []byte(tc.raw), 0o600)
			}
			flags := tc.flags
			if flags == nil {
				flags = listen
			}
			_, errs, code := cliRun(t, filepath.Join(fx.dir, "unused"), append([]string{"serve", "--tenants", fx.file}, flags...)...)
			if code != exitUsage || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, %q; want exit %d naming %q", code, errs, exitUsage, tc.want)
			}
			for _, s := range fx.specs {
				if _, err := os.Stat(filepath.Join(s.Home, socketName)); err == nil {
					t.Errorf("a refused serve left a socket in %s", s.Home)
				}
				if _, err := os.Stat(filepath.Join(s.Home, "catalog")); err == nil {
					t.Errorf("a refused serve opened %s", s.Home)
				}
			}
		})
	}
}
