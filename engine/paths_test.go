package engine

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine/paths"
)

// waiters is how many operations wait for sandbox name's lock.
func (l *sandboxLocks) waiters(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f := l.m[name]; f != nil {
		return len(f.waiters)
	}
	return 0
}

// A path restore holds the sandbox's lock: while another operation (a
// checkpoint) holds it, the restore waits and writes nothing; it runs
// once the lock is released.
func TestRestorePathsWaitsForTheSandboxLock(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	p := filepath.Join(cr.Root, "restored.txt")
	write(t, p, "then\n")
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	write(t, p, "now\n")
	_, err = e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)

	unlock, err := e.locks.sandboxes.lock(ctx, "s") // what a checkpoint in progress holds
	must(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := e.Paths().RestorePaths(ctx, "s", mustRef(c1.ID.String()), []string{"/restored.txt"}, paths.RestorePathsOptions{})
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); e.locks.sandboxes.waiters("s") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("restore never queued for the sandbox's lock")
		}
		time.Sleep(time.Millisecond)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, []byte("now\n")) {
		t.Fatalf("restore wrote while the sandbox was locked: %q", b)
	}
	unlock()
	must(t, <-done)
	if b, _ := os.ReadFile(p); !bytes.Equal(b, []byte("then\n")) {
		t.Fatalf("after the lock was released: %q", b)
	}
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	if c2.Class != "fs" {
		t.Fatalf("checkpoint after restore: %s", c2.Class)
	}
}
