//go:build turnsnaptest

package testhook

import (
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Enabled says the hooks are compiled in.
const Enabled = true

// blockLimit bounds a blocked process's wait: a test kills it long before;
// one left behind by a crashed test exits on its own.
const blockLimit = 10 * time.Minute

// BlockAt returns the BlockAtEnv hook, nil when the variable is unset.
func BlockAt() func(string) {
	phase, file, ok := splitLast(os.Getenv(BlockAtEnv))
	if !ok {
		return nil
	}
	return func(p string) {
		if p != phase {
			return
		}
		_ = os.WriteFile(file, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
		time.Sleep(blockLimit)
		os.Exit(70) // the test that armed this hook is gone
	}
}

// HoldAt returns the HoldAtEnv hook, nil when the variable is unset.
func HoldAt() func(string) {
	phase, dir, ok := splitLast(os.Getenv(HoldAtEnv))
	if !ok {
		return nil
	}
	release := filepath.Join(dir, "release")
	return func(p string) {
		if _, err := os.Stat(release); p != phase || err == nil {
			return // not this phase, or not armed
		}
		held := filepath.Join(dir, "held")
		_ = os.WriteFile(held, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
		deadline := time.Now().Add(blockLimit)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(release); err == nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		_ = os.Remove(held)
	}
}
