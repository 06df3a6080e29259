package upload_test

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
)

// killingReader is a seekable body that, once the upload has read at
// bytes, kills the server (once, before handing over more bytes) and
// restarts it on the same data directory after down.
type killingReader struct {
	*bytes.Reader
	at      int64
	once    sync.Once
	crash   func()
	crashed chan struct{}
}

func (k *killingReader) Read(p []byte) (int, error) {
	if k.Size()-int64(k.Len()) >= k.at {
		k.once.Do(func() { k.crash(); close(k.crashed) })
	}
	return k.Reader.Read(p)
}

// TestS3KillDuringUpload kills MinIO while a Put is sending its body and
// starts it again on the same data a little later: the retrying Put
// completes afterwards, the object is whole (by hash), and the objects
// stored before the crash are all still there and intact.
func TestS3KillDuringUpload(t *testing.T) {
	srv := miniotest.Start(t)
	var retries atomic.Int64
	policy := upload.RetryPolicy{
		MaxAttempts: 30, BaseDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond, MaxElapsed: time.Minute,
		OnRetry: func(upload.Op, string, int, error) { retries.Add(1) },
	}
	cfg := s3Config(srv, srv.Endpoint)
	cfg.PartSize = 5 << 20
	s := upload.WithRetry(newS3(t, cfg), policy)

	committed := map[string][]byte{
		"packs/aa/committed-small": randomBytes(20, 100<<10),
		"packs/bb/committed-multi": randomBytes(21, 11<<20+9),
		"records/committed":        randomBytes(22, 300),
	}
	for name, data := range committed {
		if err := upload.PutBytes(t.Context(), s, name, data); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name string
		size int
	}{
		{"single-put", 4<<20 + 1},   // below the 5 MiB part size: one PUT
		{"multipart", 23<<20 + 123}, // five parts
	} {
		t.Run(tc.name, func(t *testing.T) {
			retries.Store(0)
			data := randomBytes(uint64(tc.size), tc.size)
			restarted := make(chan error, 1)
			body := &killingReader{
				Reader: bytes.NewReader(data), at: int64(tc.size) * 2 / 5, crashed: make(chan struct{}),
				crash: func() {
					srv.Kill()
					go func() {
						time.Sleep(1500 * time.Millisecond)
						restarted <- srv.Restart()
					}()
				},
			}
			start := time.Now()
			err := s.Put(t.Context(), "packs/new/"+tc.name, body, int64(len(data)))
			select {
			case <-body.crashed:
			default:
				t.Fatal("the server was never killed: the test proves nothing")
			}
			if rerr := <-restarted; rerr != nil {
				t.Fatal(rerr)
			}
			if err != nil {
				t.Fatalf("Put across a server crash: %v", err)
			}
			t.Logf("Put completed %s after it started, after %d retries", time.Since(start).Round(time.Millisecond), retries.Load())
			if retries.Load() == 0 {
				t.Error("no retry happened across a server crash")
			}
			direct := newS3(t, cfg) // a fresh client: nothing cached
			wantStored(t, direct, "packs/new/"+tc.name, data)
			for name, data := range committed {
				wantStored(t, direct, name, data)
			}
		})
	}
}
