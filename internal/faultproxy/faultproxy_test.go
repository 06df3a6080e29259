package faultproxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// backend is a real HTTP server on 127.0.0.1 holding one object: PUT
// stores a body, GET returns the object. It records every request it
// handled and how many body bytes it read, so a test sees what the server
// did behind the proxy's back.
type backend struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string // "PUT /obj 1000": method, path, body bytes read
	done chan struct{}
	obj  []byte
}

func newBackend(t *testing.T, obj []byte) *backend {
	b := &backend{obj: obj, done: make(chan struct{}, 100)}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		b.mu.Lock()
		b.seen = append(b.seen, r.Method+" "+r.URL.Path+" "+itoa(n))
		b.mu.Unlock()
		b.done <- struct{}{}
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Length", itoa(int64(len(b.obj))))
			w.Write(b.obj)
			return
		}
		w.Header().Set("ETag", `"real"`)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// handled waits for the backend to finish one request, or returns "" if
// none arrives within d.
func (b *backend) handled(d time.Duration) string {
	select {
	case <-b.done:
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.seen[len(b.seen)-1]
	case <-time.After(d):
		return ""
	}
}

// setup starts a backend and a proxy in front of it that applies f to
// every request; the client opens a connection per request so that a
// reset connection is never silently retried.
func setup(t *testing.T, obj []byte, f Fault) (*backend, *Proxy, *http.Client) {
	t.Helper()
	b := newBackend(t, obj)
	p, err := Start(b.srv.URL, func(Request) Fault { return f })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	return b, p, c
}

func do(t *testing.T, c *http.Client, p *Proxy, method string, body []byte) (*http.Response, []byte, error) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+p.Addr+"/bucket/obj", r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp, data, err
}

var object = bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB

func TestPass(t *testing.T) {
	b, p, c := setup(t, object, Fault{})
	resp, data, err := do(t, c, p, http.MethodGet, nil)
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(data, object) {
		t.Fatalf("GET through a passing proxy: %v, %d bytes", err, len(data))
	}
	if got := b.handled(time.Second); got != "GET /bucket/obj 0" {
		t.Fatalf("backend saw %q", got)
	}
	if p.Requests() != 1 || p.Injected(Pass) != 0 {
		t.Fatalf("Requests %d, Injected(Pass) %d: want 1, 0 (passing is not a fault)", p.Requests(), p.Injected(Pass))
	}
}

// Fail500, Fail503 and FakeOK answer without the server hearing of it.
func TestAnswersWithoutForwarding(t *testing.T) {
	for _, tc := range []struct {
		kind   Kind
		status int
		body   string
	}{
		{Fail500, 500, "<Code>InternalError</Code>"},
		{Fail503, 503, "<Code>SlowDown</Code>"},
		{FakeOK, 200, ""},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			b, p, c := setup(t, object, Fault{Kind: tc.kind})
			resp, data, err := do(t, c, p, http.MethodPut, object)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || !strings.Contains(string(data), tc.body) {
				t.Fatalf("status %d body %q, want %d with %q", resp.StatusCode, data, tc.status, tc.body)
			}
			if tc.kind == FakeOK && (len(data) != 0 || resp.Header.Get("ETag") == "") {
				t.Fatalf("FakeOK: body %q ETag %q, want an empty body and an ETag", data, resp.Header.Get("ETag"))
			}
			if got := b.handled(300 * time.Millisecond); got != "" {
				t.Fatalf("the server handled %q, which the proxy should have answered itself", got)
			}
			if p.Injected(tc.kind) != 1 {
				t.Fatalf("Injected(%v) = %d, want 1", tc.kind, p.Injected(tc.kind))
			}
		})
	}
}

// ResetRequest: the client's upload fails, and the server never receives
// the whole body.
func TestResetRequest(t *testing.T) {
	b, p, c := setup(t, object, Fault{Kind: ResetRequest, After: 1000})
	if _, _, err := do(t, c, p, http.MethodPut, object); err == nil {
		t.Fatal("PUT through ResetRequest succeeded")
	}
	if got := b.handled(2 * time.Second); got == "PUT /bucket/obj "+itoa(int64(len(object))) {
		t.Fatalf("the server read the whole body: %q", got)
	}
}

// DropResponse: the server stores the whole upload, the client hears
// nothing but a reset.
func TestDropResponse(t *testing.T) {
	b, p, c := setup(t, object, Fault{Kind: DropResponse})
	resp, _, err := do(t, c, p, http.MethodPut, object)
	if err == nil {
		t.Fatalf("PUT through DropResponse got a response: %d", resp.StatusCode)
	}
	if got := b.handled(2 * time.Second); got != "PUT /bucket/obj "+itoa(int64(len(object))) {
		t.Fatalf("the server handled %q, want the whole PUT", got)
	}
}

// ResetResponse: the response starts, then breaks after After bytes.
func TestResetResponse(t *testing.T) {
	_, p, c := setup(t, object, Fault{Kind: ResetResponse, After: 100})
	resp, data, err := do(t, c, p, http.MethodGet, nil)
	if resp == nil {
		t.Fatalf("no response at all: %v", err)
	}
	if err == nil || len(data) > 100 || !bytes.Equal(data, object[:len(data)]) {
		t.Fatalf("read %d bytes, err %v: want at most the first 100 and an error", len(data), err)
	}
}

// Slow: the reply waits Delay and then trickles at Rate, intact.
func TestSlow(t *testing.T) {
	obj := object[:20000]
	_, p, c := setup(t, obj, Fault{Kind: Slow, Delay: 200 * time.Millisecond, Rate: 40000})
	start := time.Now()
	resp, data, err := do(t, c, p, http.MethodGet, nil)
	elapsed := time.Since(start)
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(data, obj) {
		t.Fatalf("GET through Slow: %v, %d bytes", err, len(data))
	}
	// 200 ms of delay and 20,000 bytes at 40,000 bytes/s.
	if elapsed < 600*time.Millisecond {
		t.Fatalf("took %v, want about 700 ms (at least 600)", elapsed)
	}
}

// A Plan sees each request numbered in order with its method, path and
// size, and SetPlan takes effect for the next request.
func TestPlanSeesRequests(t *testing.T) {
	b := newBackend(t, object)
	var mu sync.Mutex
	var got []Request
	p, err := Start(b.srv.URL, func(r Request) Fault {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		return Fault{}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, _, err := do(t, c, p, http.MethodPut, object[:123]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := do(t, c, p, http.MethodGet, nil); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].N != 1 || got[0].Method != "PUT" || got[0].Path != "/bucket/obj" || got[0].Size != 123 ||
		got[1].N != 2 || got[1].Method != "GET" {
		t.Fatalf("plan saw %+v", got)
	}
	p.SetPlan(func(Request) Fault { return Fault{Kind: Fail503} })
	if resp, _, err := do(t, c, p, http.MethodGet, nil); err != nil || resp.StatusCode != 503 {
		t.Fatalf("after SetPlan: %v %v, want 503", resp, err)
	}
	if p.Requests() != 3 || p.Injected(Fail503) != 1 {
		t.Fatalf("Requests %d, Injected(Fail503) %d; want 3, 1", p.Requests(), p.Injected(Fail503))
	}
}

func TestKindString(t *testing.T) {
	if FakeOK.String() != "FakeOK" || Kind(99).String() != "Kind(99)" {
		t.Fatalf("%v %v", FakeOK, Kind(99))
	}
}
