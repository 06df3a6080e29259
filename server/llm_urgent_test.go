package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/admission"
)

// TestLLMUrgentLane runs the daemon's wiring (server.LLM over a real engine
// with one checkpoint slot) behind the proxy: sandbox hold's checkpoint
// takes the slot and stops at its scan; sandbox other's checkpoint queues;
// then the agent's model call queues its own. The model answers at once, so
// the reply is ready before the checkpoint: the gate's Turn.Urgent reaches
// the engine, which promotes the waiting checkpoint past other's. So the
// agent's checkpoint commits before other's, and the reply is released.
func TestLLMUrgentLane(t *testing.T) {
	inScan, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(phase string) {
		if phase == engine.PhaseScan {
			once.Do(func() { close(inScan); <-release })
		}
	}
	f := serve(t, hook, func(o *engine.Options) { o.MaxCheckpoints = 1 })
	ctx := context.Background()
	for _, n := range []string{"hold", "other", "agent"} {
		root := f.create(t, n)
		if err := os.WriteFile(filepath.Join(root, "turn.txt"), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proxy := llmBehind(t, f, func() {})

	errs := make(chan error, 3)
	checkpoint := func(name string) {
		_, err := f.e.Checkpoint(ctx, delta.SandboxName(name), engine.CheckpointOptions{})
		errs <- err
	}
	waitFor := func(what string, ok func(admission.Stats) bool) {
		deadline := time.Now().Add(time.Minute) // a bound for a broken build, not a timing
		for st := f.e.Admission().Stats(); !ok(st); st = f.e.Admission().Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("never saw %s: %+v", what, st)
			}
			runtime.Gosched() // polling the scheduler's counters
		}
	}
	go checkpoint("hold")
	<-inScan
	go checkpoint("other")
	waitFor("other queued", func(st admission.Stats) bool { return st.Waiting == 1 })
	replied := make(chan string, 1)
	go func() {
		resp, err := http.Post(proxy.URL+"/llm/agent/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"go"}]}`))
		if err != nil {
			replied <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		replied <- fmt.Sprint(resp.StatusCode, " ", string(b))
	}()
	waitFor("the agent's checkpoint promoted", func(st admission.Stats) bool { return st.Promoted == 1 && st.UrgentWaiting == 1 })
	close(release)
	if r := <-replied; !strings.HasPrefix(r, "200 ") {
		t.Fatalf("reply: %s", r)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	created := map[string]int64{}
	for _, n := range []string{"agent", "other"} {
		log, err := f.e.History().Log(ctx, delta.SandboxName(n))
		if err != nil || len(log) == 0 {
			t.Fatalf("log of %s: %v", n, err)
		}
		created[n] = log[0].Created.UnixNano()
	}
	if created["agent"] >= created["other"] {
		t.Fatalf("the agent's checkpoint committed after other's, which it should have overtaken")
	}
	if st := f.e.Admission().Stats(); st.Urgent.Count != 1 || st.Normal.Count != 2 {
		t.Fatalf("admissions %+v, want 1 urgent and 2 normal", st)
	}
}
