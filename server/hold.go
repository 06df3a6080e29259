//go:build !turnsnaptest

package server

import ()

import ()

import ()

import ()

// The shipped binary's twin of hold_turnsnaptest.go: no test hook, and no
// environment variable read for one.

// TestHooks says the test hooks are compiled in (go test -tags
// turnsnaptest); tests that need them check it.
const TestHooks = false

func holdAtPhase() func(string) { return nil }
