package engine

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/faultproxy"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
)

// These tests need root, overlayfs and a real MinIO server on 127.0.0.1
// (built into $TURNSNAP_CACHE/bin/minio by scripts/deps.d/40-minio.sh).

func startMinIO(t testing.TB) *miniotest.Server {
	t.Helper()
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	return srv
}

func remoteCfg(endpoint, bucket string) RemoteConfig {
	return RemoteConfig{URL: "s3://" + bucket + "/hosts", Endpoint: endpoint, Insecure: true}
}

// remoteRecords lists the checkpoint records the bucket holds.
func remoteRecords(t *testing.T, e *Engine) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	must(t, e.stores.remote.List(context.Background(), delta.RecordPrefix, func(oi upload.ObjectInfo) error {
		out[strings.TrimPrefix(oi.Name, delta.RecordPrefix)] = true
		return nil
	}))
	return out
}

func TestRestoreAnywhereFromTheBucket(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	a := newEngine(t)
	cr, err := a.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c1, err := a.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	// A home with history gets a remote: everything is queued, nothing is
	// remote yet.
	ir, err := a.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "anywhere"))
	must(t, err)
	if ir.Queued < 5 {
		t.Fatalf("init queued %d objects", ir.Queued)
	}
	st, err := a.HomeSetup().Status(ctx)
	must(t, err)
	if st.QueueDepth != ir.Queued || remoteRecords(t, a)[c1.ID.String()] {
		t.Fatalf("before push: queue %d (want %d), record remote: %v", st.QueueDepth, ir.Queued, remoteRecords(t, a)[c1.ID.String()])
	}
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	// A turn after init is queued by its commit and pushed urgently.
	write(t, filepath.Join(cr.Root, "after-init"), "x")
	c2, err := a.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	st, err = a.HomeSetup().Status(ctx)
	must(t, err)
	if st.QueueDepth == 0 || st.Sandboxes[0].PendingCheckpoints != 1 {
		t.Fatalf("a new checkpoint is not queued: %+v", st)
	}
	_, err = a.Remote().Push(ctx, PushOptions{Sandbox: "s", Urgent: true})
	must(t, err)
	if st, _ = a.HomeSetup().Status(ctx); st.QueueDepth != 0 {
		t.Fatalf("queue after push: %+v", st)
	}
	want := mergedState(t, cr.Root)

	// Another host: empty home, no base dir, no catalog; only the bucket.
	b := newEngine(t)
	_, err = b.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "anywhere"))
	must(t, err)
	rep, err := b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if rep.Checkpoints != 3 || rep.Sandboxes != 1 {
		t.Fatalf("rebuild from the bucket found %d checkpoints, %d sandboxes", rep.Checkpoints, rep.Sandboxes)
	}
	if n := countObjects(t, b.stores.local); n > 8 {
		t.Fatalf("rebuild downloaded %d objects; it should read pack headers remotely", n)
	}
	br, err := b.Branch(ctx, mustRef(c2.ID.String()), "copy", BranchOptions{})
	must(t, err)
	if got := mergedState(t, br.Root); got != want {
		t.Fatalf("branch on the second host hashes to %s, want %s", got.Short(), want.Short())
	}
	if _, err := b.Verifier().Verify(ctx, mustRef(c2.ID.String())); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint is never reported remotely durable before its PUTs
// succeeded, and the bucket never holds a record without its packs.
func TestRemoteDurabilityIsNeverClaimedEarly(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	var failPacks atomic.Bool
	var n atomic.Int64
	proxy, err := faultproxy.Start("http://"+srv.Endpoint, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "PUT" && strings.Contains(r.Path, "/packs/") && failPacks.Load() {
			return faultproxy.Fault{Kind: faultproxy.Fail500}
		}
		// Transient trouble everywhere else: every 4th request fails or
		// loses its response after the server acted on it.
		switch n.Add(1) % 8 {
		case 3:
			return faultproxy.Fault{Kind: faultproxy.Fail503}
		case 6:
			return faultproxy.Fault{Kind: faultproxy.DropResponse}
		}
		return faultproxy.Fault{Kind: faultproxy.Pass}
	})
	must(t, err)
	t.Cleanup(func() { proxy.Close() })
	e := newEngine(t)
	_, err = e.HomeSetup().Init(ctx, remoteCfg(proxy.Addr, "durable"))
	must(t, err)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err) // retries ride out the transient faults

	failPacks.Store(true)
	big := make([]byte, 3<<20)
	rand.Read(big)
	must(t, os.WriteFile(filepath.Join(cr.Root, "big.bin"), big, 0o644))
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	pctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	_, err = e.Remote().Push(pctx, PushOptions{Sandbox: "s", Urgent: true})
	cancel()
	if err == nil {
		t.Fatal("push claimed success while every pack PUT failed")
	}
	if remoteRecords(t, e)[c.ID.String()] {
		t.Fatal("the bucket holds a record whose pack never arrived")
	}
	st, err := e.HomeSetup().Status(ctx)
	must(t, err)
	if st.Sandboxes[0].PendingCheckpoints != 1 {
		t.Fatalf("failed upload left the queue as %+v", st)
	}
	failPacks.Store(false)
	_, err = e.Remote().Push(ctx, PushOptions{})
	must(t, err)
	if !remoteRecords(t, e)[c.ID.String()] {
		t.Fatal("record missing after a successful push")
	}
	checkBucket(t, srv, "durable")
}

func TestMinIOKilledDuringPush(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	e := newEngine(t)
	_, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "crash"))
	must(t, err)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	big := make([]byte, 40<<20) // three packs
	rand.Read(big)
	must(t, os.WriteFile(filepath.Join(cr.Root, "big.bin"), big, 0o644))
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	// The server dies between the push's first and second uploads (Yield
	// runs before each), so the push provably crosses the crash; the
	// second upload then meets a dead server until the restart is done.
	var uploads atomic.Int32
	killed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Remote().Push(ctx, PushOptions{Yield: func(context.Context) {
			if uploads.Add(1) == 2 {
				srv.Kill()
				close(killed)
			}
		}})
		done <- err
	}()
	select {
	case <-killed:
	case err := <-done:
		t.Fatalf("the push ended before its second upload (%v): the test needs three packs", err)
	}
	must(t, srv.Restart())
	if err := <-done; err != nil {
		// Retries may run out while the server is down; a second push
		// finishes what is left.
		t.Logf("push across the crash: %v; pushing again", err)
		_, err = e.Remote().Push(ctx, PushOptions{})
		must(t, err)
	}
	if !remoteRecords(t, e)[c.ID.String()] {
		t.Fatal("record missing after the push completed")
	}
	checkBucket(t, srv, "crash")
}

// checkBucket proves from a fresh home that every record in the bucket is
// complete: each verifies, reading only what the bucket holds.
func checkBucket(t *testing.T, srv *miniotest.Server, bucket string) {
	t.Helper()
	ctx := context.Background()
	f := newEngine(t)
	_, err := f.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, bucket))
	must(t, err)
	_, err = f.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	var ids []delta.ID
	must(t, f.view(ctx, func(tx *catalog.Tx) error {
		return tx.ForEachCheckpoint(func(cp *delta.Checkpoint) error { ids = append(ids, cp.ID); return nil })
	}))
	if len(ids) == 0 {
		t.Fatal("bucket holds no records")
	}
	for _, id := range ids {
		if _, err := f.Verifier().Verify(ctx, mustRef(id.String())); err != nil {
			t.Errorf("record %s in the bucket does not verify: %v", id.Short(), err)
		}
	}
}

// TestPushYieldsBeforeEachUpload: PushOptions.Yield (how the daemon's
// background rounds give way to urgent checkpoints) runs before every
// upload, and while it holds, no pack or record reaches the bucket.
func TestPushYieldsBeforeEachUpload(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	e := newEngine(t)
	_, err := e.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "yield"))
	must(t, err)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	c, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	var calls atomic.Int64
	gate := make(chan struct{})
	type result struct {
		rep *PushReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := e.Remote().Push(ctx, PushOptions{Yield: func(context.Context) {
			calls.Add(1)
			<-gate
		}})
		done <- result{rep, err}
	}()
	for deadline := time.Now().Add(30 * time.Second); calls.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the push never yielded")
		}
	}
	for _, prefix := range []string{delta.PackPrefix, delta.RecordPrefix} {
		must(t, e.stores.remote.List(ctx, prefix, func(oi upload.ObjectInfo) error {
			t.Errorf("%s reached the bucket while the push was yielding", oi.Name)
			return nil
		}))
	}
	close(gate)
	res := <-done
	must(t, res.err)
	if res.rep.Uploaded == 0 || calls.Load() != int64(res.rep.Uploaded) {
		t.Fatalf("%d uploads, %d yields: want one yield per upload", res.rep.Uploaded, calls.Load())
	}
	if !remoteRecords(t, e)[c.ID.String()] {
		t.Fatal("record missing after the push")
	}
	checkBucket(t, srv, "yield")
}
