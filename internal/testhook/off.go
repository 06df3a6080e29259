//go:build !turnsnaptest

package testhook

// Enabled says the hooks are compiled in: not in this build.
const Enabled = false

// BlockAt is compiled out of this build.
func BlockAt() func(string) { return nil }

// HoldAt is compiled out of this build.
func HoldAt() func(string) { return nil }
