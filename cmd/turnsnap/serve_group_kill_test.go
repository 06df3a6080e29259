package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
)

// kill -9 of the daemon while several sandboxes' commits share one catalog
// transaction (a group commit, held just before it commits): none of that
// group's checkpoints is in the catalog afterwards (their records, written
// before the transaction, are in the store, garbage for gc), every
// sandbox's line is intact and verifies, and each sandbox's next
// checkpoint lands on its own head with the killed turn's files.
func TestServeKill9MidGroupCommit(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "base.txt"), []byte("base\n"), 0o644)
	const n = 6
	roots := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("g%d", i)
		var c struct{ Root string }
		out, _ := mustCLI(t, home, "sandbox", "create", name, "--base", base, "--json")
		if err := json.Unmarshal([]byte(out), &c); err != nil {
			t.Fatal(err)
		}
		roots[i] = c.Root
		t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", name) })
	}
	flag := filepath.Join(t.TempDir(), "reached")
	d := startDaemon(t, home, []string{testhook.BlockAtEnv + "=" + engine.PhaseCommitGroup + ":" + flag})
	c, err := client.New(client.Options{Socket: filepath.Join(home, socketName)})
	if err != nil {
		t.Fatal(err)
	}
	// Rounds of n concurrent turns until two commits share a transaction
	// (they do as soon as one arrives while another's is being written).
	grouped := false
	var done []api.ID // the checkpoints the API reported committed
	for round := 0; round < 50 && !grouped; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range n {
			os.WriteFile(filepath.Join(roots[i], fmt.Sprintf("r%02d.txt", round)), []byte(fmt.Sprintf("round %d of g%d\n", round, i)), 0o644)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				r, err := c.Checkpoint(ctx, fmt.Sprintf("g%d", i), api.CheckpointRequest{})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					done = append(done, r.ID)
				} else if !grouped {
					t.Errorf("g%d: checkpoint failed before any kill: %v", i, err)
				}
			}()
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
	wait:
		for {
			if _, err := os.Stat(flag); err == nil {
				mu.Lock()
				grouped = true
				mu.Unlock()
				d.cmd.Process.Kill() // SIGKILL, the group's transaction held open
				<-d.exited
				<-finished
				break
			}
			select {
			case <-finished:
				break wait
			case <-time.After(10 * time.Millisecond):
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	if !grouped {
		t.Fatal("no two commits ever shared a transaction (the test proves nothing)")
	}
	// Direct mode from here: the records the killed group wrote are in the
	// store, and none of them is in the catalog; what the API reported
	// committed is.
	known := map[string]bool{}
	heads := make([]string, n)
	for i := range n {
		out, _ := mustCLI(t, home, "log", fmt.Sprintf("g%d", i), "--json")
		var log []struct {
			ID   string
			Head bool
		}
		if err := json.Unmarshal([]byte(out), &log); err != nil {
			t.Fatalf("log of g%d: %v: %s", i, err, out)
		}
		for _, e := range log {
			known[e.ID] = true
			if e.Head {
				heads[i] = e.ID
			}
		}
		if heads[i] == "" {
			t.Fatalf("g%d has no head after the kill: %s", i, out)
		}
	}
	for _, id := range done {
		if !known[id.String()] {
			t.Fatalf("checkpoint %s was reported committed and is not in the catalog", id)
		}
	}
	ents, err := os.ReadDir(filepath.Join(home, "store", strings.TrimSuffix(delta.RecordPrefix, "/")))
	if err != nil {
		t.Fatal(err)
	}
	orphans := 0
	for _, e := range ents {
		if !known[e.Name()] {
			orphans++
		}
	}
	if orphans < 2 {
		t.Fatalf("%d records outside the catalog after killing a group of at least two: a part of the group committed", orphans)
	}
	mustCLI(t, home, "verify", "--store-only")
	for i := range n {
		name := fmt.Sprintf("g%d", i)
		out, _ := mustCLI(t, home, "checkpoint", name, "--json")
		var r struct{ ID, Parent, Class string }
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if r.Parent != heads[i] {
			t.Fatalf("%s: the turn after the kill has parent %s, want its head %s", name, r.Parent, heads[i])
		}
		if !known[r.Parent] || r.Class != "fs" && r.Class != "skip" {
			t.Fatalf("%s: the turn after the kill: %s", name, out)
		}
		mustCLI(t, home, "verify", r.ID)
	}
}
