package criu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// criuPath is the CRIU that scripts/criu-install.sh installs (proc's
// DefaultCRIUPath, which this package cannot import); it stops t unless
// the test runs as root with that CRIU present.
func criuPath(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = "/var/cache/turnsnap"
	}
	p := filepath.Join(cache, "criu", "criu")
	if _, err := os.Stat(p); err != nil {
		testenv.Missing(t, "CRIU", "scripts/criu-install.sh installs it at "+p)
	}
	return p
}

// CRIU_FAULT=130 as proc passes it (proc.DefaultCRIUFault).
var testEnv = append(os.Environ(), "CRIU_FAULT=130")

// EnsureKdat leaves CRIU a kernel-data cache that CRIU really loads (its
// log says so, instead of "does not exist" and a fresh probe), and makes
// it again when the link names nothing (after a reboot emptied /dev/shm).
func TestKdatCacheLoadedByCRIU(t *testing.T) {
	bin := criuPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if st, err := EnsureKdat(ctx, bin, testEnv); err != nil || st == KdatForeign || st == KdatNative {
		t.Skipf("/run/criu.kdat is not turnsnap's here (%q %v); nothing to check", st, err)
	}
	loaded := func() bool {
		log := filepath.Join(t.TempDir(), "check.log")
		cmd := exec.Command(bin, "check", "-v4", "-o", log)
		cmd.Env = testEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("criu check: %v: %s", err, out)
		}
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(b), "Loaded kdat cache from "+KdatPath)
	}
	if !loaded() {
		t.Fatal("CRIU did not load the cache turnsnap keeps")
	}
	if err := os.Remove(KdatFile); err != nil {
		t.Fatal(err)
	}
	if st, err := EnsureKdat(ctx, bin, testEnv); err != nil || st != KdatMade {
		t.Fatalf("after the file went: %q %v", st, err)
	}
	if !loaded() {
		t.Fatal("CRIU did not load the remade cache")
	}
}
