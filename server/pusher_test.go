package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// A pusher round that no one waits for yields to an urgent checkpoint (one
// whose model reply is waiting): it starts uploading only once that
// checkpoint is done. A round someone waits for does not yield. Real MinIO
// on 127.0.0.1, a real engine; the checkpoint is held at its scan.
func TestPusherYieldsToUrgentCheckpoint(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	inScan, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	armed := false // set before the checkpoint it stops starts
	hook := func(phase string) {
		if phase == engine.PhaseScan && armed {
			once.Do(func() { close(inScan); <-release })
		}
	}
	e, err := engine.Open(ctx, engine.Options{Home: filepath.Join(dir, "home"), AtPhase: hook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sbs, _ := e.ListSandboxes(context.Background())
		for _, s := range sbs {
			e.RemoveSandbox(context.Background(), s.Sandbox.Name)
		}
		e.Close()
	})
	if _, err := e.HomeSetup().Init(ctx, engine.RemoteConfig{URL: "s3://yield/hosts", Endpoint: srv.Endpoint, Insecure: true}); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	for _, n := range []string{"queued", "urgent"} {
		res, err := e.CreateSandbox(ctx, delta.SandboxName(n), engine.CreateOptions{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(res.Root, "turn.txt"), []byte(n), 0o644)
	}
	if _, err := e.Checkpoint(ctx, "queued", engine.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	depth := func() int {
		st, err := e.HomeSetup().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.QueueDepth
	}
	if depth() == 0 {
		t.Fatal("nothing queued to push")
	}
	// The urgent checkpoint: its reply is already waiting (Urgent closed).
	armed = true
	urgent := make(chan struct{})
	close(urgent)
	ckpt := make(chan error, 1)
	go func() {
		_, err := e.Checkpoint(ctx, "urgent", engine.CheckpointOptions{Urgent: urgent})
		ckpt <- err
	}()
	<-inScan

	p := NewPusher(e, nil, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	// A waiter's round goes at once, urgent checkpoint or not.
	w := &waiter{done: make(chan pushResult, 1)}
	p.waiters = []*waiter{w}
	if err := p.round(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-w.done; r.err != nil || depth() != 0 {
		t.Fatalf("waited-for round: %v, %d objects left", r.err, depth())
	}
	if st := e.Admission().Stats(); st.Yields != 0 {
		t.Fatalf("a round someone waits for yielded: %+v", st)
	}
	// An idle round waits for the urgent checkpoint.
	round := make(chan error, 1)
	go func() { round <- p.round(ctx) }()
	deadline := time.Now().Add(time.Minute) // a bound for a broken build, not a timing
	for e.Admission().Stats().Yields == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle round never yielded")
		}
		runtime.Gosched()
	}
	select {
	case err := <-round:
		t.Fatalf("the idle round ran beside an urgent checkpoint (%v)", err)
	default:
	}
	close(release)
	if err := <-ckpt; err != nil {
		t.Fatal(err)
	}
	if err := <-round; err != nil {
		t.Fatal(err)
	}
	if n := depth(); n != 0 {
		t.Fatalf("%d objects left after the idle round", n)
	}
}
