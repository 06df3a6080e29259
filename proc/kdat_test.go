package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A Runtime leaves CRIU a kernel-data cache that CRIU really loads (its
// log says so, instead of "does not exist" and a fresh probe), and makes
// it again when the link names nothing (after a reboot emptied /dev/shm).
func TestKdatCacheLoadedByCRIU(t *testing.T) {
	rt := newRuntime(t)
	st, ok := kdatLinked()
	if !ok || st == KdatForeign {
		t.Skipf("/run/criu.kdat is not turnsnap's here (%q); nothing to check", st)
	}
	loaded := func() bool {
		log := filepath.Join(t.TempDir(), "check.log")
		cmd := exec.Command(rt.cfg.CRIU, "check", "-v4", "-o", log)
		cmd.Env = rt.criuEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("criu check: %v: %s", err, out)
		}
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(b), "Loaded kdat cache from "+kdatPath)
	}
	if !loaded() {
		t.Fatal("CRIU did not load the cache turnsnap keeps")
	}
	if err := os.Remove(kdatTarget()); err != nil {
		t.Fatal(err)
	}
	if st, err := rt.ensureKdat(testCtx(t)); err != nil || st != KdatMade {
		t.Fatalf("after the file went: %q %v", st, err)
	}
	if !loaded() {
		t.Fatal("CRIU did not load the remade cache")
	}
}
