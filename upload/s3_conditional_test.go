package upload_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/faultproxy"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
)

// Conditional writes on a real MinIO: create only when absent, replace
// only the version last read, and of many writers racing from one version
// exactly one wins. The ownership protocol (docs/STORAGE.md) stands on
// these three facts.
func TestS3ConditionalWrites(t *testing.T) {
	srv := miniotest.Start(t)
	s := newS3(t, s3Config(srv, srv.Endpoint))
	c, err := upload.AsConditional(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const name = "refs/heads/x"
	v1, err := c.PutIf(ctx, name, []byte("one\n"), "")
	if err != nil || v1 == "" {
		t.Fatalf("create: %q, %v", v1, err)
	}
	if _, err := c.PutIf(ctx, name, []byte("other\n"), ""); !errors.Is(err, upload.ErrConditionFailed) {
		t.Fatalf("second create: %v, want ErrConditionFailed", err)
	}
	data, v, err := c.GetVersion(ctx, name, 64)
	if err != nil || string(data) != "one\n" || v != v1 {
		t.Fatalf("GetVersion = %q %q %v; want one, %q", data, v, err, v1)
	}
	v2, err := c.PutIf(ctx, name, []byte("two\n"), v1)
	if err != nil || v2 == v1 {
		t.Fatalf("replace: %q, %v", v2, err)
	}
	if _, err := c.PutIf(ctx, name, []byte("stale\n"), v1); !errors.Is(err, upload.ErrConditionFailed) || !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("stale replace: %v, want ErrConditionFailed", err)
	}
	if _, _, err := c.GetVersion(ctx, name, 2); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("GetVersion past max: %v, want ErrCorrupt", err)
	}
	if _, _, err := c.GetVersion(ctx, "refs/heads/none", 64); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetVersion of a missing object: %v, want ErrNotFound", err)
	}

	// Racing writers from one version: exactly one wins.
	_, v, err = c.GetVersion(ctx, name, 64)
	if err != nil {
		t.Fatal(err)
	}
	const writers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.PutIf(ctx, name, []byte(fmt.Sprintf("writer %d\n", i)), v)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case !errors.Is(err, upload.ErrConditionFailed):
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d of %d racing conditional writes won, want exactly 1", won, writers)
	}
}

// A conditional write whose answer is lost after the server applied it is
// retried by WithRetry; the retry is refused by the write itself, and the
// wrapper must recognise its own bytes instead of reporting a conflict. A
// real conflict behind a lost answer stays a conflict.
func TestS3ConditionalWriteLostAnswer(t *testing.T) {
	srv := miniotest.Start(t)
	var mu sync.Mutex
	drop := false
	p, err := faultproxy.Start("http://"+srv.Endpoint, func(r faultproxy.Request) faultproxy.Fault {
		mu.Lock()
		defer mu.Unlock()
		if drop && r.Method == "PUT" {
			drop = false
			return faultproxy.Fault{Kind: faultproxy.DropResponse}
		}
		return faultproxy.Fault{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg := s3Config(srv, p.Addr)
	s := upload.WithRetry(newS3(t, cfg), fastRetry)
	c, err := upload.AsConditional(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const name = "refs/heads/y"
	mu.Lock()
	drop = true
	mu.Unlock()
	v1, err := c.PutIf(ctx, name, []byte("mine\n"), "")
	if err != nil {
		t.Fatalf("create with a lost answer: %v (the retry must see its own bytes)", err)
	}
	if p.Injected(faultproxy.DropResponse) != 1 {
		t.Fatalf("%d responses dropped, want 1: the test proves nothing", p.Injected(faultproxy.DropResponse))
	}
	data, v, err := c.GetVersion(ctx, name, 64)
	if err != nil || string(data) != "mine\n" || v != v1 {
		t.Fatalf("after the lost answer: %q %q %v; want mine, %q", data, v, err, v1)
	}
	// Another writer moves the object; our stale write with a lost answer
	// is still a conflict.
	direct, _ := upload.AsConditional(newS3(t, upload.S3Config{Endpoint: srv.Endpoint, Bucket: cfg.Bucket, Prefix: cfg.Prefix,
		Insecure: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Region: "us-east-1"}))
	if _, err := direct.PutIf(ctx, name, []byte("theirs\n"), v1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutIf(ctx, name, []byte("stale\n"), v1); !errors.Is(err, upload.ErrConditionFailed) {
		t.Fatalf("stale write: %v, want ErrConditionFailed", err)
	}
}
