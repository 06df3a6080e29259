// Package testenv lets tests that need a real part (root, overlayfs, and
// later btrfs, runc, CRIU, MinIO) say so. Outside `make test` a missing part
// skips the test with a loud SKIPPED line; under `make test`, which installs
// every part, TURNSNAP_REQUIRE_ALL=1 turns the same condition into a failure,
// so CI can never pass by skipping.
package testenv

import (
	"net"
	"os"
	"testing"
)

// RequireAllEnv is set by `make test`.
const RequireAllEnv = "TURNSNAP_REQUIRE_ALL"

// Missing skips t, or fails it under `make test`, naming the absent part.
func Missing(t testing.TB, part, why string) {
	t.Helper()
	if os.Getenv(RequireAllEnv) == "1" {
		t.Fatalf("%s is missing (%s), but %s=1: `make test` must install every part", part, why, RequireAllEnv)
	}
	t.Skipf("SKIPPED: %s is missing (%s); `make test` installs it", part, why)
}

// RequireRoot stops t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root", "mounts, chown, trusted xattrs and device nodes need it")
	}
}

// FreePort returns a TCP port free on host now, for a server a test starts
// that takes its port as a flag. Another process may take it before the
// server binds it; the callers' servers fail loudly then.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
