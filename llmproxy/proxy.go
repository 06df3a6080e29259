package llmproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Gate says what a model reply waits for before the agent sees it.
type Gate string

const (
	// GateLocal holds the reply until the turn's checkpoint is committed on
	// this host: the default, and nearly free because the checkpoint runs
	// during the model's latency.
	GateLocal Gate = "local"
	// GateRemote holds it until the checkpoint is in the remote store.
	GateRemote Gate = "remote"
	// GateNone releases it at once; the checkpoint still runs.
	GateNone Gate = "none"
)

// ParseGate reads a --llm-gate value.
func ParseGate(s string) (Gate, error) {
	switch g := Gate(s); g {
	case GateLocal, GateRemote, GateNone:
		return g, nil
	case "":
		return GateLocal, nil
	}
	return "", fmt.Errorf("gate %q: want local, remote or none: %w", s, errdefs.ErrInvalid)
}

// Defaults, with their reasons.
const (
	// DefaultGateTimeout bounds how long a reply may wait for a checkpoint:
	// a large fs turn takes seconds, and an agent's own model timeout is
	// typically minutes; past this the reply goes out and the failure is
	// counted.
	DefaultGateTimeout = 30 * time.Second
	// DefaultMaxBody is the largest request body the proxy buffers to read
	// the conversation (long agent conversations with images reach a few
	// MiB). A larger body is streamed through and still closes a turn, with
	// an unknown position and no journal entry.
	DefaultMaxBody = 32 << 20
	// DefaultMaxJournal is the largest reply journaled.
	DefaultMaxJournal = 16 << 20
)

// Options configures New. The zero value of every field but Upstream works.
type Options struct {
	// Upstream is the default upstream base URL (scheme, host, optional path
	// prefix); /llm/{sandbox}/v1/messages goes to Upstream + /v1/messages.
	Upstream string
	// UpstreamFor, if set, returns a sandbox's own upstream ("" for the
	// default). An error wrapping errdefs.ErrNotFound answers 404.
	UpstreamFor func(ctx context.Context, sandbox string) (string, error)
	// Turns takes the checkpoints; nil forwards every call without one.
	Turns Turns
	// Journal keeps exchanges for fast-forward replay; nil keeps none.
	Journal Journal
	// ReplayFor, if set, returns a sandbox's replay setting (ReplayAuto or
	// ReplayOff; "" is auto). An error counts as off.
	ReplayFor   func(ctx context.Context, sandbox string) (Replay, error)
	Gate        Gate
	GateTimeout time.Duration
	// Strict answers 503 (application/problem+json) instead of releasing
	// the reply when the checkpoint failed or the gate timed out.
	Strict bool
	// NonTurn lists further path suffixes that never close a turn (token
	// counting, listing and embeddings never do).
	NonTurn    []string
	MaxBody    int64
	MaxJournal int64
	// Registerer receives the proxy's metrics; nil keeps them private.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Transport reaches the upstreams; nil uses one shared keep-alive
	// transport.
	Transport http.RoundTripper
}

// Proxy is the http.Handler serving /llm/{sandbox}/<path>.
//
// It forwards with httputil.ReverseProxy: it already streams bodies both
// ways without buffering, flushes each write of a text/event-stream reply
// (FlushInterval -1 makes that hold for every reply), strips hop-by-hop
// headers, passes every other header (Authorization, x-api-key) untouched,
// and its ModifyResponse hook runs after the upstream's reply head arrives
// and before any byte reaches the agent, which is exactly where the gate
// belongs.
type Proxy struct {
	opts Options
	def  *url.URL
	rp   *httputil.ReverseProxy
	m    *metrics
	log  *slog.Logger

	ctx    context.Context // checkpoints run under it; Close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	inflight  map[inflightKey]*pending
	recording map[string]map[*recorder]struct{} // sandbox → replies being journaled

	onGate      func(gateEvent) // test hook: one call per held reply
	beforeParse func()          // test hook: runs as a forwarded call's conversation is read beside it
	afterParse  func()          // test hook: runs once it was read (and the turn begun or joined)
}

type ctxKey struct{}

// exchange is one request's state, carried in its context from ServeHTTP
// to the ReverseProxy hooks.
type exchange struct {
	sandbox string
	target  *url.URL
	path    string // the path to forward, escaped
	req     Request
	turn    bool
	journal bool // record the reply
	body    []byte
	pend    *pending
	// parsed, when set, is closed once the fields above are final: the
	// conversation is read beside the forwarded request (prepareTurn), and
	// every hook that runs after the upstream answered waits for it.
	parsed chan struct{}
}

// wait returns once x's conversation has been read.
func (x *exchange) wait() {
	if x.parsed != nil {
		<-x.parsed
	}
}

// New returns a proxy; Close it to stop its checkpoints.
func New(opts Options) (*Proxy, error) {
	def, err := parseUpstream(opts.Upstream)
	if err != nil && opts.UpstreamFor == nil {
		return nil, err
	}
	if opts.Gate, err = ParseGate(string(opts.Gate)); err != nil {
		return nil, err
	}
	if opts.GateTimeout <= 0 {
		opts.GateTimeout = DefaultGateTimeout
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxBody
	}
	if opts.MaxJournal <= 0 {
		opts.MaxJournal = DefaultMaxJournal
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Transport == nil {
		opts.Transport = NewTransport()
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Proxy{opts: opts, def: def, m: m, log: opts.Logger,
		inflight: map[inflightKey]*pending{}, recording: map[string]map[*recorder]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      opts.Transport,
		FlushInterval:  -1,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     copyBuffers{},
		ErrorLog:       slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	return p, nil
}

// NewTransport returns the keep-alive transport the proxy shares across
// sandboxes. It never compresses on its own (DisableCompression), so the
// agent's Accept-Encoding and the upstream's reply pass through as they are.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:       http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		// Many sandboxes talk to one upstream host at once; the default of 2
		// idle connections per host would redial for most of them.
		MaxIdleConns:          512,
		MaxIdleConnsPerHost:   128,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		DisableCompression:    true,
	}
}

// Close cancels the checkpoints still running and waits for them.
func (p *Proxy) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

// copyBuffers lends ReverseProxy its reply-copying buffers; without a pool
// it allocates (and zeroes) 32 KiB for every call.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[32 << 10]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if cap(b) == 32<<10 {
		copyBufferPool.Put((*[32 << 10]byte)(b[:32<<10]))
	}
}

func parseUpstream(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("llm upstream %q: want an http(s) URL: %w", s, errdefs.ErrInvalid)
	}
	return u, nil
}

// splitRoute splits /llm/{sandbox}/<path> (escaped) into its parts.
func splitRoute(escaped string) (sandbox, path string, ok bool) {
	route, ok := strings.CutPrefix(escaped, "/llm/")
	if !ok {
		return "", "", false
	}
	sandbox, path, ok = strings.Cut(route, "/")
	if !ok || !delta.ValidRefName(sandbox) {
		return "", "", false
	}
	// No dot segments: a per-sandbox upstream with a path prefix must not be
	// escaped by /llm/a1/../other.
	for rest := path; ; {
		seg, more, found := strings.Cut(rest, "/")
		if seg == "." || seg == ".." {
			return "", "", false
		}
		if strings.IndexByte(seg, '%') >= 0 {
			if u, err := url.PathUnescape(seg); err != nil || u == "." || u == ".." {
				return "", "", false
			}
		}
		if !found {
			break
		}
		rest = more
	}
	return sandbox, route[len(sandbox):], true // "/" + path, without a copy
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sandbox, path, ok := splitRoute(r.URL.EscapedPath())
	if !ok {
		writeProblem(w, http.StatusNotFound, "Not a sandbox route", "the LLM proxy serves /llm/{sandbox}/<upstream path>")
		return
	}
	target, err := p.upstream(r.Context(), sandbox)
	if err != nil {
		status := http.StatusBadGateway
		if errors.Is(err, errdefs.ErrNotFound) {
			status = http.StatusNotFound
		}
		writeProblem(w, status, "No upstream for this sandbox", err.Error())
		return
	}
	x := &exchange{sandbox: sandbox, target: target, path: path}
	if shape, turn := p.isTurn(r.Method, path); turn {
		if done := p.prepareTurn(w, r, x, shape); done {
			return
		}
	} else {
		p.m.requests.WithLabelValues("passthrough").Inc()
	}
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, x)))
}

func (p *Proxy) upstream(ctx context.Context, sandbox string) (*url.URL, error) {
	if p.opts.UpstreamFor != nil {
		s, err := p.opts.UpstreamFor(ctx, sandbox)
		if err != nil {
			return nil, err
		}
		if s != "" {
			return parseUpstream(s)
		}
	}
	if p.def == nil {
		return nil, fmt.Errorf("sandbox %s has no LLM upstream and no default is set: %w", sandbox, errdefs.ErrNotFound)
	}
	return p.def, nil
}

// isTurn applies the turn rule: a POST to a model-call path that is not
// listed as a non-turn.
func (p *Proxy) isTurn(method, path string) (Shape, bool) {
	if method != http.MethodPost {
		return "", false
	}
	shape, ok := shapeOf(path)
	if !ok {
		return "", false
	}
	for _, s := range p.opts.NonTurn {
		if strings.HasSuffix(path, s) {
			return "", false
		}
	}
	return shape, true
}

// prepareTurn reads the model call's body, answers it from the journal if
// it may (done), and otherwise starts the turn's checkpoint.
//
// When the journal may not answer the call (no journal, no entry for this
// sandbox, replay off, or a live timeline: no re-run armed and no opt-in;
// docs/LLM-PROXY.md "When the journal answers"), the call is forwarded at
// once and its conversation read beside it from the same bytes: the
// position and the hash only number the checkpoint, which runs
// concurrently with the model anyway. Otherwise the hash decides whether
// the model is called at all, so it is read first (about 15 us for a
// 12 KiB conversation).
func (p *Proxy) prepareTurn(w http.ResponseWriter, r *http.Request, x *exchange, shape Shape) (done bool) {
	head, err := readBody(r.Body, r.ContentLength, p.opts.MaxBody)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "Reading the request body failed", err.Error())
		return true
	}
	x.turn = true
	x.req = Request{Shape: shape, Turn: -1}
	if int64(len(head)) > p.opts.MaxBody {
		// Too large to read: forward it as it comes; it still ends a turn.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
		p.m.requests.WithLabelValues("turn").Inc()
		if p.opts.Journal != nil {
			p.opts.Journal.Live(x.sandbox) // it goes to the model
		}
		x.pend = p.begin(x.sandbox, x.req)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(head))
	x.body = head
	mode := ReplayOff
	if p.opts.Journal != nil {
		if mode, err = p.replayFor(r, x.sandbox); err != nil {
			writeProblem(w, http.StatusBadRequest, "Bad journal header", err.Error())
			return true
		}
	}
	// Only a call the journal might answer needs its hash before it is
	// forwarded: on a live timeline (no re-run armed), every call goes to
	// the model.
	if p.opts.Journal == nil || mode == ReplayOff || journalEmpty(p.opts.Journal, x.sandbox) ||
		(mode == ReplayAuto && !p.opts.Journal.Rerunning(x.sandbox)) {
		if p.opts.Journal != nil && mode == ReplayOff {
			p.opts.Journal.Live(x.sandbox)
		}
		x.parsed = make(chan struct{})
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer close(x.parsed)
			if p.beforeParse != nil {
				p.beforeParse()
			}
			if p.classify(x) {
				x.pend = p.begin(x.sandbox, x.req)
			}
			if p.afterParse != nil {
				p.afterParse()
			}
		}()
		return false
	}
	if !p.classify(x) {
		return false
	}
	if e := p.answer(r.Context(), x, mode); e != nil {
		p.replay(w, e)
		return true
	}
	x.pend = p.begin(x.sandbox, x.req)
	return false
}

// classify reads x's conversation and counts the request: a turn (true),
// or a body that is no conversation, which the upstream answers (most
// likely with a 400) and which closes no turn.
func (p *Proxy) classify(x *exchange) bool {
	req, err := ParseRequest(x.req.Shape, x.body)
	if err != nil {
		p.m.requests.WithLabelValues("unparsed").Inc()
		x.turn = false
		return false
	}
	x.req = req
	x.journal = p.opts.Journal != nil
	p.m.requests.WithLabelValues("turn").Inc()
	return true
}

// journalEmpty says that j holds no entry for sandbox, so that no call of
// it can be answered from the journal, when j can tell cheaply.
func journalEmpty(j Journal, sandbox string) bool {
	e, ok := j.(interface{ Empty(sandbox string) bool })
	return ok && e.Empty(sandbox)
}

// readBody reads a request body of at most max bytes, or max+1 bytes of a
// larger one. A declared length sizes the buffer once: no regrowth and no
// copy on the request path.
func readBody(r io.Reader, length, max int64) ([]byte, error) {
	if length < 0 || length > max {
		return io.ReadAll(io.LimitReader(r, max+1))
	}
	b := make([]byte, length)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	// The server enforces the declared length; a body that says more is
	// still read to its end, bounded.
	var one [1]byte
	if n, _ := r.Read(one[:]); n > 0 {
		rest, err := io.ReadAll(io.LimitReader(r, max-length))
		return append(append(b, one[0]), rest...), err
	}
	return b, nil
}

// replay answers a call with a journaled exchange (Proxy.answer chose
// it): the recorded reply, byte for byte.
func (p *Proxy) replay(w http.ResponseWriter, e *Entry) {
	p.m.requests.WithLabelValues("journal").Inc()
	h := w.Header()
	if e.ContentType != "" {
		h.Set("Content-Type", e.ContentType)
	}
	if e.ContentEncoding != "" {
		h.Set("Content-Encoding", e.ContentEncoding)
	}
	if !e.Stream {
		h.Set("Content-Length", fmt.Sprint(len(e.Response)))
	}
	h.Set(ReplayHeader, "replay")
	w.WriteHeader(e.Status)
	w.Write(e.Response)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(ctxKey{}).(*exchange)
	u := *pr.Out.URL
	u.RawPath = x.path
	u.Path, _ = url.PathUnescape(x.path) // splitRoute's input was already a valid escaped path
	pr.Out.URL = &u
	pr.SetURL(x.target)
	pr.Out.Header.Del(ReplayHeader) // the proxy's own, not the model's

}

func (p *Proxy) modifyResponse(resp *http.Response) error {
	x, _ := resp.Request.Context().Value(ctxKey{}).(*exchange)
	if x == nil {
		return nil
	}
	x.wait()
	if !x.turn {
		return nil
	}
	if x.pend != nil {
		if err := p.hold(resp.Request.Context(), x); err != nil {
			return err
		}
	}
	if x.journal && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		p.record(x, resp)
	}
	return nil
}

func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	var ge *gateError
	switch {
	case errors.As(err, &ge):
		writeProblem(w, http.StatusServiceUnavailable, "Checkpoint not committed", ge.Error())
	case r.Context().Err() != nil:
		// The agent hung up; nobody is left to answer.
	default:
		p.m.upstreamErrs.Inc()
		x, _ := r.Context().Value(ctxKey{}).(*exchange)
		detail := err.Error()
		if x != nil {
			p.log.Warn("llm upstream unreachable", "sandbox", x.sandbox, "upstream", x.target.Redacted(), "err", err)
		}
		writeProblem(w, http.StatusBadGateway, "LLM upstream unreachable", detail)
	}
}

// writeProblem answers with an RFC 9457 problem document.
func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
}
