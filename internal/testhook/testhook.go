// Package testhook holds the hooks that let a test stop turnsnap at an exact
// phase (to SIGKILL it there, or to hold a daemon's turn open). They are
// compiled in only under the build tag `turnsnaptest` (`make test` sets it):
// the shipped binary reads no test variables, so an environment variable can
// never make a production turnsnap write a file or block.
package testhook

import "strings"

// Names of the variables the hooks read (under the build tag only).
const (
	// BlockAtEnv=PHASE:FILE: on reaching PHASE, write the process id to
	// FILE and block for ever (a killed-at-phase test).
	BlockAtEnv = "TURNSNAP_TEST_BLOCK_AT"
	// HoldAtEnv=PHASE:DIR: on reaching PHASE, while DIR/release does
	// not exist, create DIR/held and wait until it does (a daemon's turn
	// held open while the test acts).
	HoldAtEnv = "TURNSNAP_TEST_HOLD_AT"
)

// Chain calls each non-nil hook in order; nil when there are none.
func Chain(hooks ...func(string)) func(string) {
	var hs []func(string)
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return nil
	}
	return func(p string) {
		for _, h := range hs {
			h(p)
		}
	}
}

// splitLast splits "PHASE:ARG" at its last colon: phase names may hold
// colons ("rollback: layer-rewrite").
func splitLast(v string) (phase, arg string, ok bool) {
	i := strings.LastIndexByte(v, ':')
	if i <= 0 || i == len(v)-1 {
		return "", "", false
	}
	return v[:i], v[i+1:], true
}
