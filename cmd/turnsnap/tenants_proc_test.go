package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Two tenants with a sandbox of the same name run two containers (runc),
// each in its own home's root: a command through one tenant's token runs
// in that tenant's container and sees its files, and a detached process of
// one does not show in the other's.
func TestTenantsSameNameContainers(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	fx := newTenants(t, dir, "alpha", "bravo")
	for i := range fx.specs {
		base := busyboxBase(t, "ps")
		os.WriteFile(filepath.Join(base, "who"), []byte(fx.specs[i].Name+"\n"), 0o644)
		fx.specs[i].Bases = base
	}
	fx.write(t)
	d := startDaemon(t, fx.specs[0].Home, nil, "--tenants", fx.file, "--listen", "127.0.0.1:0")
	addr := tcpAddr(t, d)
	ctx := context.Background()
	for i, s := range fx.specs {
		c := tcpClient(t, addr, fx.tokens[i])
		if _, err := c.CreateSandbox(ctx, api.CreateRequest{Name: "same", Base: s.Bases}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.RemoveSandbox(context.Background(), "same", false) })
	}
	ca, cb := tcpClient(t, addr, fx.tokens[0]), tcpClient(t, addr, fx.tokens[1])
	if _, err := cb.Exec(ctx, "same", api.ExecRequest{Argv: []string{"sleep", "300"}, Detach: true}, api.Stdio{}); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		name string
		c    *client.Client
	}{{"alpha", ca}, {"bravo", cb}} {
		var out bytes.Buffer
		ex, err := c.c.Exec(ctx, "same", api.ExecRequest{Argv: []string{"sh", "-c", "cat /who; ps -o args"}}, api.Stdio{Out: &out})
		if err != nil || ex.ExitCode != 0 {
			t.Fatalf("tenant %s's exec: %+v %v", c.name, ex, err)
		}
		got := out.String()
		if !strings.HasPrefix(got, c.name+"\n") {
			t.Errorf("tenant %s's command ran in %q", c.name, got)
		}
		if sleeping := strings.Contains(got, "sleep 300"); sleeping != (i == 1) {
			t.Errorf("tenant %s's container processes: %s", c.name, got)
		}
	}
}
