//go:build turnsnaptest

package server

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The daemon's test hooks, compiled only into test builds (go test -tags
// turnsnaptest); hold.go is their no-op twin in the shipped binary, which
// never reads their environment.

// TestHooks says the test hooks are compiled in.
const TestHooks = true

// HoldAtPhaseEnv is a test hook of the daemon: TURNSNAP_TEST_HOLD_AT=PHASE:DIR
// makes a checkpoint reaching PHASE, while DIR/release does not exist,
// create DIR/held and wait until DIR/release exists, so a test can act
// while a commit is held (send SIGTERM, run another sandbox's turn) and
// then let it go.
const HoldAtPhaseEnv = "TURNSNAP_TEST_HOLD_AT"

func holdAtPhase() func(string) {
	phase, dir, ok := strings.Cut(os.Getenv(HoldAtPhaseEnv), ":")
	if !ok || dir == "" {
		return nil
	}
	return func(p string) {
		release := filepath.Join(dir, "release")
		if _, err := os.Stat(release); p != phase || err == nil {
			return // not this phase, or not armed
		}
		os.WriteFile(filepath.Join(dir, "held"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
		for {
			if _, err := os.Stat(release); err == nil {
				os.Remove(filepath.Join(dir, "held"))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
