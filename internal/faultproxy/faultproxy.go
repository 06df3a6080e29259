// Package faultproxy is an HTTP reverse proxy on 127.0.0.1 that injects
// failures into the traffic between a client and a server by plan: 500
// answers, connections reset in the middle of a request or response body,
// responses dropped after the server acted on the request, slow replies,
// and lies (a 200 for a request never forwarded). Tests put it between the
// S3 store and a real MinIO to show what the client does about each.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// Kind is one kind of injected fault.
type Kind int

// The faults. "Reset" means the proxy closes the client's connection with
// a TCP RST (SO_LINGER 0), as a crashed peer or middlebox would.
const (
	// Pass forwards the request and response untouched.
	Pass Kind = iota
	// Fail500 answers 500 InternalError without forwarding anything.
	Fail500
	// Fail503 answers 503 SlowDown without forwarding anything.
	Fail503
	// ResetRequest forwards only the first After bytes of the request body
	// (so the server sees a truncated upload) and resets the client.
	ResetRequest
	// DropResponse forwards the whole request, lets the server act on it,
	// then resets the client before any of the response reaches it.
	DropResponse
	// ResetResponse forwards the request and cuts the response body after
	// After bytes, closing the connection mid-body.
	ResetResponse
	// Slow waits Delay before forwarding, then passes the request and
	// trickles the response body at Rate bytes/s if Rate is set.
	Slow
	// FakeOK answers 200 with an empty body and never forwards: a server
	// that acknowledges what it did not store.
	FakeOK
)

var kindNames = [...]string{"Pass", "Fail500", "Fail503", "ResetRequest", "DropResponse", "ResetResponse", "Slow", "FakeOK"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Fault is what to do with one request.
type Fault struct {
	Kind  Kind
	After int64         // ResetRequest, ResetResponse: bytes let through first
	Delay time.Duration // Slow: wait before forwarding
	Rate  int64         // Slow: response body bytes/s; 0 means no limit
}

// Request is what a Plan sees of a request. N counts requests through the
// proxy from 1.
type Request struct {
	N      int
	Method string
	Path   string // the URL path, with the bucket and key for S3
	Query  url.Values
	Size   int64 // the request's Content-Length, -1 if unknown
}

// A Plan picks the fault for each request. It is called from many
// goroutines at once, with requests numbered in arrival order.
type Plan func(Request) Fault

// Proxy is a running fault-injecting proxy.
type Proxy struct {
	// Addr is HOST:PORT of the proxy, for the client's endpoint.
	Addr string

	srv *http.Server
	rp  *httputil.ReverseProxy

	mu       sync.Mutex
	plan     Plan
	n        int
	injected map[Kind]int
}

// faultKey carries a request's fault from the handler to the proxy's hooks.
type faultKey struct{}

// Start starts a proxy on 127.0.0.1 in front of target ("http://HOST:PORT")
// with plan (nil passes everything). Close stops it.
func Start(target string, plan Plan) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("fault proxy target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), plan: plan, injected: map[Kind]int{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			// Keep the Host the client signed its request for.
			pr.Out.Host = pr.In.Host
		},
		Transport:      &http.Transport{MaxIdleConnsPerHost: 16},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		FlushInterval:  -1,
		// Injected faults make it complain about every cut body.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// SetPlan replaces the plan for requests from now on.
func (p *Proxy) SetPlan(plan Plan) {
	p.mu.Lock()
	p.plan = plan
	p.mu.Unlock()
}

// Injected returns how many faults of kind k the proxy has injected.
func (p *Proxy) Injected(k Kind) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.injected[k]
}

// Requests returns how many requests have reached the proxy.
func (p *Proxy) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() error { return p.srv.Close() }

func (p *Proxy) pick(r *http.Request) Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	f := Fault{}
	if p.plan != nil {
		f = p.plan(Request{N: p.n, Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Size: r.ContentLength})
	}
	if f.Kind != Pass {
		p.injected[f.Kind]++
	}
	return f
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	f := p.pick(r)
	switch f.Kind {
	case Fail500:
		s3Error(w, http.StatusInternalServerError, "InternalError", "injected by faultproxy")
		return
	case Fail503:
		s3Error(w, http.StatusServiceUnavailable, "SlowDown", "injected by faultproxy")
		return
	case FakeOK:
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("ETag", `"00000000000000000000000000000000"`)
		w.WriteHeader(http.StatusOK)
		return
	case Slow:
		select {
		case <-time.After(f.Delay):
		case <-r.Context().Done():
			return
		}
	case ResetRequest:
		// The upstream request fails after After bytes, which aborts its
		// connection (the server sees a short body); errorHandler then
		// resets the client.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(io.LimitReader(r.Body, f.After), failReader{}), r.Body}
	}
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), faultKey{}, f)))
}

// errInjected marks failures the proxy made itself.
var errInjected = errors.New("faultproxy: injected")

func (p *Proxy) modifyResponse(resp *http.Response) error {
	f, _ := resp.Request.Context().Value(faultKey{}).(Fault)
	switch f.Kind {
	case DropResponse:
		// The server has acted; make sure it has finished before hanging
		// up, then let errorHandler reset the client.
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return errInjected
	case ResetResponse:
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(io.LimitReader(resp.Body, f.After), failReader{}), resp.Body}
	case Slow:
		if f.Rate > 0 {
			resp.Body = &trickle{rc: resp.Body, rate: f.Rate, ctx: resp.Request.Context()}
		}
	}
	return nil
}

// errorHandler resets the client connection for injected faults, and
// answers 502 for real upstream failures.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	f, _ := r.Context().Value(faultKey{}).(Fault)
	if f.Kind == ResetRequest || f.Kind == DropResponse || errors.Is(err, errInjected) {
		reset(w)
		return
	}
	s3Error(w, http.StatusBadGateway, "BadGateway", err.Error())
}

// reset hijacks the client connection and closes it with an RST.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // closes the connection all the same
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

func s3Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message></Error>`, code, msg)
}

// failReader fails every read, cutting the stream it ends.
type failReader struct{}

func (failReader) Read([]byte) (int, error) { return 0, errInjected }

// trickle passes a body through at rate bytes/s.
type trickle struct {
	rc   io.ReadCloser
	rate int64
	ctx  context.Context
}

func (t *trickle) Read(p []byte) (int, error) {
	chunk := max(t.rate/20, 1) // 50 ms of bytes per read
	if int64(len(p)) > chunk {
		p = p[:chunk]
	}
	n, err := t.rc.Read(p)
	select {
	case <-time.After(time.Duration(int64(n) * int64(time.Second) / t.rate)):
	case <-t.ctx.Done():
		return n, t.ctx.Err()
	}
	return n, err
}

func (t *trickle) Close() error { return t.rc.Close() }
