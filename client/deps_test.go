package client

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The client is for programs that drive a daemon, so it must not link the
// engine, its storage or CRIU: only package api and the standard library
// (and internal/errdefs, the error classes).
func TestClientDependencies(t *testing.T) {
	// go test puts its own GOROOT/bin first on the PATH.
	gocmd, err := exec.LookPath("go")
	if err != nil {
		testenv.Missing(t, "the go command", "go list lists the dependencies")
	}
	out, err := exec.Command(gocmd, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const mod = "github.com/turnsnap/turnsnap/"
	forbidden := []string{mod + "engine", mod + "catalog", mod + "delta", mod + "upload", mod + "proc",
		mod + "overlay", mod + "btrfs", "github.com/dgraph-io/badger", "github.com/minio/minio-go",
		"github.com/checkpoint-restore/go-criu"}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("package client depends on %s", d)
			}
		}
	}
	if len(deps) < 2 {
		t.Fatalf("go list -deps listed %q", deps)
	}
}
