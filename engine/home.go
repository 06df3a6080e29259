package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Home layout. Everything turnsnap keeps on a host lives under one directory:
//
//	HOME/lock            flock held by the one turnsnap process using HOME
//	HOME/store/          the local object store (embedded default)
//	HOME/catalog/        Badger catalog (an index: rebuildable from store/)
//	HOME/bases/ID/       materialised base trees, the overlay lower dirs
//	HOME/sandboxes/NAME/ one sandbox's root and writable layer
//	HOME/intents/        interrupted operations (engine/intent)
type home string

func (h home) lockFile() string   { return filepath.Join(string(h), "lock") }
func (h home) storeDir() string   { return filepath.Join(string(h), "store") }
func (h home) catalogDir() string { return filepath.Join(string(h), "catalog") }
func (h home) basesDir() string   { return filepath.Join(string(h), "bases") }
func (h home) sandboxDir(name delta.SandboxName) string {
	return filepath.Join(string(h), "sandboxes", string(name))
}
func (h home) intentsDir() string { return filepath.Join(string(h), "intents") }

// homeLock is the exclusive hold on a home. Badger allows one process per
// database, and sandbox layers must not be rewritten by two processes at
// once, so every command holds this for its whole run.
type homeLock struct{ f *os.File }

// lockHome takes the home's lock, waiting up to wait for another turnsnap
// process to finish. The lock file holds the holder's pid and command, so
// the error can say who is in the way.
func lockHome(ctx context.Context, h home, wait time.Duration, readOnly bool) (*homeLock, error) {
	if err := os.MkdirAll(string(h), 0o700); err != nil && !readOnly {
		return nil, fmt.Errorf("home %s: %w", h, err)
	}
	f, err := os.OpenFile(h.lockFile(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil && readOnly {
		// A read-only home: flock works on a descriptor opened for reading.
		f, err = os.Open(h.lockFile())
	}
	if err != nil {
		return nil, fmt.Errorf("home %s: %w", h, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("home %s: lock: %w", h, err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			holder, _ := os.ReadFile(h.lockFile())
			f.Close()
			return nil, fmt.Errorf("home %s is in use by another turnsnap process (%s); waited %s, retry later or raise --lock-wait: %w",
				h, describeHolder(string(holder)), wait, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	info := fmt.Sprintf("pid %d: %s", os.Getpid(), strings.Join(os.Args, " "))
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(info), 0)
	}
	return &homeLock{f: f}, nil
}

// describeHolder reads what the holder wrote into the lock file ("pid N:
// command"); it may be empty if the holder has not written it yet.
func describeHolder(s string) string {
	if s = strings.TrimSpace(s); s != "" {
		return s
	}
	return "holder unknown"
}

func (l *homeLock) release() {
	l.f.Truncate(0)
	l.f.Close() // closing the descriptor drops the flock
}
