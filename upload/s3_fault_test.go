package upload_test

// The S3 store behind internal/faultproxy, in front of a real MinIO: what
// retries recover from, and that a Put never claims an object the server
// does not have.

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/faultproxy"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

// fastRetry retries often and quickly, so tests full of faults stay short.
var fastRetry = upload.RetryPolicy{MaxAttempts: 10, BaseDelay: 5 * time.Millisecond, MaxDelay: 100 * time.Millisecond}

func startProxy(t *testing.T, srv *miniotest.Server, plan faultproxy.Plan) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start("http://"+srv.Endpoint, plan)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// randomFaults injects a fault into about a fifth of all requests, of
// every kind that a real network or server produces.
func randomFaults(seed uint64) faultproxy.Plan {
	rng := rand.New(rand.NewPCG(seed, 0))
	return func(r faultproxy.Request) faultproxy.Fault {
		if rng.IntN(5) != 0 {
			return faultproxy.Fault{}
		}
		switch rng.IntN(6) {
		case 0:
			return faultproxy.Fault{Kind: faultproxy.Fail500}
		case 1:
			return faultproxy.Fault{Kind: faultproxy.Fail503}
		case 2:
			if r.Size > 0 {
				return faultproxy.Fault{Kind: faultproxy.ResetRequest, After: rng.Int64N(r.Size)}
			}
			return faultproxy.Fault{Kind: faultproxy.DropResponse}
		case 3:
			return faultproxy.Fault{Kind: faultproxy.DropResponse}
		case 4:
			return faultproxy.Fault{Kind: faultproxy.ResetResponse, After: rng.Int64N(4 << 20)}
		default:
			return faultproxy.Fault{Kind: faultproxy.Slow, Delay: time.Duration(rng.IntN(100)) * time.Millisecond, Rate: 64 << 20}
		}
	}
}

// TestS3ConformanceFaultProxy runs the whole contract through a proxy that
// breaks a fifth of the requests: WithRetry must hide every fault.
func TestS3ConformanceFaultProxy(t *testing.T) {
	srv := miniotest.Start(t)
	p := startProxy(t, srv, randomFaults(1))
	storetest.Run(t, func(t *testing.T) upload.Store {
		return upload.WithRetry(newS3(t, s3Config(srv, p.Addr)), fastRetry)
	})
	for _, k := range []faultproxy.Kind{faultproxy.Fail500, faultproxy.Fail503, faultproxy.ResetRequest,
		faultproxy.DropResponse, faultproxy.ResetResponse, faultproxy.Slow} {
		if p.Injected(k) == 0 {
			t.Errorf("no %s fault was injected; the test proves nothing about it", k)
		}
		t.Logf("%s: %d", k, p.Injected(k))
	}
	t.Logf("%d requests", p.Requests())
}

// TestS3ConformanceFaulty runs the contract through upload.Faulty, which
// fails every third call of each operation and cuts every fourth Put off
// halfway, with WithRetry on top.
func TestS3ConformanceFaulty(t *testing.T) {
	srv := miniotest.Start(t)
	plan := upload.FaultPlan{Fail: map[upload.Op][]int{}}
	for n := 3; n < 3000; n += 3 {
		for _, op := range []upload.Op{upload.OpPut, upload.OpGet, upload.OpStat, upload.OpList, upload.OpDelete} {
			plan.Fail[op] = append(plan.Fail[op], n)
		}
	}
	for n := 4; n < 3000; n += 4 {
		plan.HalfPut = append(plan.HalfPut, n)
	}
	storetest.Run(t, func(t *testing.T) upload.Store {
		return upload.WithRetry(upload.NewFaulty(newS3(t, s3Config(srv, srv.Endpoint)), plan), fastRetry)
	})
}

// onlyPuts applies f to the PUT requests that carry object data (single
// PUTs and parts), numbered from 1, for which pick says so.
func onlyPuts(f faultproxy.Fault, pick func(n int) bool) faultproxy.Plan {
	n := 0
	return func(r faultproxy.Request) faultproxy.Fault {
		if r.Method != http.MethodPut || !strings.Contains(strings.Trim(r.Path, "/"), "/") {
			return faultproxy.Fault{} // not an object (a bucket has no slash)
		}
		n++
		if pick(n) {
			return f
		}
		return faultproxy.Fault{}
	}
}

func first(n int) bool { return n == 1 }
func always(int) bool  { return true }

// TestS3PutNeverEarly checks, by looking at MinIO directly, that a Put
// reports success only for an object the server really stored whole, and
// that a failed Put leaves nothing behind.
func TestS3PutNeverEarly(t *testing.T) {
	srv := miniotest.Start(t)
	data := randomBytes(7, 3<<20+5)
	big := randomBytes(8, 12<<20+3) // multipart at the 5 MiB part size below
	for _, tc := range []struct {
		name    string
		fault   faultproxy.Fault
		pick    func(int) bool
		retry   bool
		data    []byte
		wantErr error // nil: the Put must succeed
	}{
		// The server stored the object, the answer is lost: the retry puts
		// it again and then, only then, reports success.
		{"DropResponse/retry", faultproxy.Fault{Kind: faultproxy.DropResponse}, first, true, data, nil},
		// Without retries the same loss is an error although the object
		// exists: an error means "maybe", never "yes" without proof.
		{"DropResponse/once", faultproxy.Fault{Kind: faultproxy.DropResponse}, first, false, data, errdefs.ErrUnavailable},
		// The upload breaks midway: nothing is stored, the error says so.
		{"ResetRequest/once", faultproxy.Fault{Kind: faultproxy.ResetRequest, After: 1 << 20}, first, false, data, errdefs.ErrUnavailable},
		{"ResetRequest/retry", faultproxy.Fault{Kind: faultproxy.ResetRequest, After: 1 << 20}, first, true, data, nil},
		{"Fail500/once", faultproxy.Fault{Kind: faultproxy.Fail500}, first, false, data, errdefs.ErrUnavailable},
		// A server that says 200 without storing anything is caught by the
		// checksum check, and a retry that really stores the object wins.
		{"FakeOK/once", faultproxy.Fault{Kind: faultproxy.FakeOK}, first, false, data, errdefs.ErrUnavailable},
		{"FakeOK/retry", faultproxy.Fault{Kind: faultproxy.FakeOK}, first, true, data, nil},
		{"FakeOK/always", faultproxy.Fault{Kind: faultproxy.FakeOK}, always, true, data, errdefs.ErrUnavailable},
		// Multipart: the second part breaks, or every part is slow.
		{"Multipart/ResetPart2", faultproxy.Fault{Kind: faultproxy.ResetRequest, After: 100}, func(n int) bool { return n == 2 }, true, big, nil},
		{"Multipart/Slow", faultproxy.Fault{Kind: faultproxy.Slow, Delay: 200 * time.Millisecond}, always, false, big, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, srv, onlyPuts(tc.fault, tc.pick))
			cfg := s3Config(srv, p.Addr)
			cfg.PartSize = 5 << 20
			s := newS3(t, cfg)
			if tc.retry {
				s = upload.WithRetry(s, fastRetry)
			}
			cfg.Endpoint = srv.Endpoint
			direct := newS3(t, cfg)

			start := time.Now()
			err := upload.PutBytes(t.Context(), s, "obj", tc.data)
			took := time.Since(start)
			if p.Injected(tc.fault.Kind) == 0 {
				t.Fatalf("the proxy injected no %s", tc.fault.Kind)
			}
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Put: %v", err)
				}
				wantStored(t, direct, "obj", tc.data)
				if tc.fault.Kind == faultproxy.Slow && took < tc.fault.Delay {
					t.Errorf("Put returned after %s, before the slow server (%s) answered", took, tc.fault.Delay)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Put: got error %v, want %v", err, tc.wantErr)
			}
			t.Logf("Put failed as it should: %v", err)
			if tc.fault.Kind != faultproxy.DropResponse {
				if _, err := direct.Stat(t.Context(), "obj"); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("after a failed Put, Stat on the server: got %v, want ErrNotFound", err)
				}
			}
		})
	}
}

// TestS3ResumeGet cuts GET responses midway: a retrying Get resumes where
// the body broke and returns the object whole.
func TestS3ResumeGet(t *testing.T) {
	srv := miniotest.Start(t)
	p := startProxy(t, srv, nil)
	s := upload.WithRetry(newS3(t, s3Config(srv, p.Addr)), fastRetry)
	data := randomBytes(9, 9<<20+1)
	if err := upload.PutBytes(t.Context(), s, "obj", data); err != nil {
		t.Fatal(err)
	}
	gets := 0
	p.SetPlan(func(r faultproxy.Request) faultproxy.Fault {
		if r.Method != http.MethodGet {
			return faultproxy.Fault{}
		}
		gets++
		if gets <= 3 { // three breaks, each 2 MiB further in
			return faultproxy.Fault{Kind: faultproxy.ResetResponse, After: 2 << 20}
		}
		return faultproxy.Fault{}
	})
	wantStored(t, s, "obj", data)
	if gets != 4 {
		t.Errorf("%d GETs, want 4 (one, then three resumes)", gets)
	}
	// A ranged read resumes within its range.
	gets = 0
	rc, err := upload.GetRange(t.Context(), s, "obj", 1<<20, 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := readAll(t, rc)
	if !bytes.Equal(got, data[1<<20:6<<20]) {
		t.Errorf("resumed GetRange: %d bytes, not the range asked for", len(got))
	}
}
