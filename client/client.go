// Package client is the Go client of turnsnap's API (package api), over
// the home's unix socket or over TCP with a bearer token. Its methods are
// the server.Service methods, with the same arguments and results, and an
// error the server reported is an *api.Problem that errors.Is matches
// against its errdefs class, so a caller cannot tell the daemon from a
// direct engine by the results.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Options says where the daemon is. Exactly one of Socket and URL.
type Options struct {
	Socket string // path of a daemon's unix socket (HOME/turnsnap.sock)
	URL    string // http:// or https:// base URL of a TCP daemon
	Token  string // bearer token (TCP)
	// HTTPClient, if set, is used for URL (custom TLS roots, say).
	HTTPClient *http.Client
}

// Client talks to one daemon. It is safe for concurrent use.
type Client struct {
	hc    *http.Client
	base  string
	token string
	where string // for errors
}

// New makes a client; it does not connect yet.
func New(opts Options) (*Client, error) {
	switch {
	case opts.Socket != "" && opts.URL == "":
		sock := opts.Socket
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			MaxIdleConnsPerHost: 64,
		}
		return &Client{hc: &http.Client{Transport: tr}, base: "http://turnsnap", where: "daemon at " + sock}, nil
	case opts.URL != "" && opts.Socket == "":
		u, err := url.Parse(opts.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("daemon URL %q: want http://HOST:PORT or https://HOST:PORT: %w", opts.URL, errdefs.ErrInvalid)
		}
		hc := opts.HTTPClient
		if hc == nil {
			hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		}
		return &Client{hc: hc, base: strings.TrimRight(opts.URL, "/"), token: opts.Token, where: "daemon at " + u.Host}, nil
	}
	return nil, fmt.Errorf("client: give a socket or a URL: %w", errdefs.ErrInvalid)
}

// Ping checks that the daemon answers (GET /healthz).
func (c *Client) Ping(ctx context.Context) error {
	var h map[string]string
	return c.do(ctx, http.MethodGet, "/healthz", nil, &h)
}

func (c *Client) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// maxResponse bounds a JSON response (a verify lists every object read).
const maxResponse = 256 << 20

// do sends in (nil: no body) and decodes the response into out.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := c.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.transportErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c.problem(resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponse)).Decode(out); err != nil {
		return fmt.Errorf("%s: %s %s: bad response: %v: %w", c.where, method, path, err, errdefs.ErrUnavailable)
	}
	return nil
}

func (c *Client) transportErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%s: %v: %w", c.where, err, errdefs.ErrUnavailable)
}

// problem reads an error response: a problem+json becomes an *api.Problem
// (its class intact); anything else is the daemon's failure.
func (c *Client) problem(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" {
		var p api.Problem
		if json.Unmarshal(data, &p) == nil && p.Detail != "" {
			return problemOf(&p)
		}
	}
	class := errdefs.ErrUnavailable
	if resp.StatusCode == http.StatusUnauthorized {
		class = errdefs.ErrPrecondition
	}
	return fmt.Errorf("%s: HTTP %d: %s: %w", c.where, resp.StatusCode, strings.TrimSpace(string(data)), class)
}

// problemOf is a problem the server sent, made an error of its class
// again (errors.Is(err, errdefs.ErrNotFound) holds for a not_found one).
func problemOf(p *api.Problem) *api.Problem {
	p.Err = errdefs.ByClass(p.Class)
	return p
}

func esc(s string) string { return url.PathEscape(s) }

func (c *Client) CreateSandbox(ctx context.Context, req api.CreateRequest) (*api.Created, error) {
	return call[api.Created](ctx, c, http.MethodPost, "/v1/sandboxes", req)
}

func (c *Client) ListSandboxes(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	return out, c.do(ctx, http.MethodGet, "/v1/sandboxes", nil, &out)
}

func (c *Client) GetSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	return call[api.Sandbox](ctx, c, http.MethodGet, "/v1/sandboxes/"+esc(name), nil)
}

func (c *Client) SandboxPath(ctx context.Context, name string) (*api.SandboxPath, error) {
	return call[api.SandboxPath](ctx, c, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/mount", nil)
}

func (c *Client) RemoveSandbox(ctx context.Context, name string, catalogOnly bool) (*api.Removed, error) {
	var out api.Removed
	path := "/v1/sandboxes/" + esc(name)
	if catalogOnly {
		path += "?catalog_only=true"
	}
	return &out, c.do(ctx, http.MethodDelete, path, nil, &out)
}

func (c *Client) AdoptSandbox(ctx context.Context, name string, req api.AdoptRequest) (*api.Adopted, error) {
	return call[api.Adopted](ctx, c, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/adopt", req)
}

func (c *Client) ResumeSandbox(ctx context.Context, name string) (*api.Resumed, error) {
	return call[api.Resumed](ctx, c, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/resume", nil)
}

func (c *Client) Checkpoint(ctx context.Context, name string, req api.CheckpointRequest) (*api.Checkpoint, error) {
	return call[api.Checkpoint](ctx, c, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/checkpoints", req)
}

func (c *Client) Log(ctx context.Context, name string) ([]api.LogEntry, error) {
	var out []api.LogEntry
	return out, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+esc(name)+"/checkpoints", nil, &out)
}

func (c *Client) GetCheckpoint(ctx context.Context, ref string) (*api.LogEntry, error) {
	return call[api.LogEntry](ctx, c, http.MethodGet, "/v1/checkpoints/"+esc(ref), nil)
}

func (c *Client) Diff(ctx context.Context, name, from, to string) (*api.Diff, error) {
	q := url.Values{}
	if from != "" {
		q.Set("from", from)
	}
	if to != "" {
		q.Set("to", to)
	}
	p := "/v1/sandboxes/" + esc(name) + "/diff"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var out api.Diff
	return &out, c.do(ctx, http.MethodGet, p, nil, &out)
}

func (c *Client) Rollback(ctx context.Context, name string, req api.RollbackRequest) (*api.Restore, error) {
	return call[api.Restore](ctx, c, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/rollback", req)
}

func (c *Client) Branch(ctx context.Context, ref string, req api.BranchRequest) ([]api.Restore, error) {
	var out []api.Restore
	return out, c.do(ctx, http.MethodPost, "/v1/checkpoints/"+esc(ref)+"/branches", req, &out)
}

func (c *Client) Verify(ctx context.Context, ref string) (*api.Verified, error) {
	return call[api.Verified](ctx, c, http.MethodPost, "/v1/checkpoints/"+esc(ref)+"/verify", nil)
}

func (c *Client) VerifyStore(ctx context.Context, req api.StoreVerifyRequest) (*api.StoreVerified, error) {
	return call[api.StoreVerified](ctx, c, http.MethodPost, "/v1/store/verify", req)
}

func (c *Client) Tags(ctx context.Context) ([]api.Tag, error) {
	var out []api.Tag
	return out, c.do(ctx, http.MethodGet, "/v1/tags", nil, &out)
}

func (c *Client) SetTag(ctx context.Context, name string, req api.TagRequest) (*api.Tagged, error) {
	return call[api.Tagged](ctx, c, http.MethodPut, "/v1/tags/"+esc(name), req)
}

func (c *Client) DeleteTag(ctx context.Context, name string) (*api.Untagged, error) {
	return call[api.Untagged](ctx, c, http.MethodDelete, "/v1/tags/"+esc(name), nil)
}

func (c *Client) Status(ctx context.Context) (*api.StatusReport, error) {
	return call[api.StatusReport](ctx, c, http.MethodGet, "/v1/status", nil)
}

func (c *Client) Sync(ctx context.Context, req api.SyncRequest) (*api.Synced, error) {
	return call[api.Synced](ctx, c, http.MethodPost, "/v1/sync", req)
}

func (c *Client) Prune(ctx context.Context, req api.PruneRequest) (*api.Pruned, error) {
	return call[api.Pruned](ctx, c, http.MethodPost, "/v1/prune", req)
}

func (c *Client) GC(ctx context.Context, req api.GCRequest) (*api.GCReport, error) {
	return call[api.GCReport](ctx, c, http.MethodPost, "/v1/gc", req)
}

func (c *Client) Init(ctx context.Context, req api.InitRequest) (*api.Initialised, error) {
	return call[api.Initialised](ctx, c, http.MethodPost, "/v1/init", req)
}

func (c *Client) RebuildCatalog(ctx context.Context, req api.RebuildRequest) (*api.Rebuilt, error) {
	return call[api.Rebuilt](ctx, c, http.MethodPost, "/v1/catalog/rebuild", req)
}

// Exec runs a command in the sandbox, streaming its output to stdio.Out
// and stdio.Err and, if stdio.In is set, its input from it while it runs.
// A detached command returns at once with its pid.
func (c *Client) Exec(ctx context.Context, name string, req api.ExecRequest, stdio api.Stdio) (*api.Exited, error) {
	if stdio.In != nil && !req.Detach && len(req.Stdin) == 0 {
		req.StdinStream = true
	}
	head, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var body io.Reader = bytes.NewReader(head)
	if req.StdinStream {
		body = io.MultiReader(bytes.NewReader(head), stdio.In)
	}
	hreq, err := c.request(ctx, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/exec", body)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, c.transportErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, c.problem(resp)
	}
	if req.Detach {
		var out api.Exited
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponse)).Decode(&out); err != nil {
			return nil, fmt.Errorf("%s: exec: bad response: %v: %w", c.where, err, errdefs.ErrUnavailable)
		}
		return &out, nil
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var f api.ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return nil, fmt.Errorf("%s: exec: bad frame: %v: %w", c.where, err, errdefs.ErrUnavailable)
		}
		switch {
		case f.Error != nil:
			return nil, problemOf(f.Error)
		case f.ExitCode != nil:
			return &api.Exited{ExitCode: *f.ExitCode, Sandbox: name}, nil
		case f.Stream == "stdout" && stdio.Out != nil:
			stdio.Out.Write(f.Data)
		case f.Stream == "stderr" && stdio.Err != nil:
			stdio.Err.Write(f.Data)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, c.transportErr(err)
	}
	return nil, fmt.Errorf("%s: exec in sandbox %s: the stream ended without an exit status: %w", c.where, name, errdefs.ErrUnavailable)
}

// Events calls fn with each event (of sandbox, or all if "") until
// ctx ends, the daemon stops, or fn returns an error.
func (c *Client) Events(ctx context.Context, sandbox string, fn func(api.Event) error) error {
	return c.EventsAfter(ctx, sandbox, "", fn)
}

// EventsAfter is Events resuming after the event whose ID is last (sent
// as Last-Event-ID): every event after it comes first, from the daemon's
// ring of recent events, led by an api.EventGap event for those it no
// longer has. "" starts from now, as Events.
func (c *Client) EventsAfter(ctx context.Context, sandbox, last string, fn func(api.Event) error) error {
	p := "/v1/events"
	if sandbox != "" {
		p += "?sandbox=" + url.QueryEscape(sandbox)
	}
	req, err := c.request(ctx, http.MethodGet, p, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.transportErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c.problem(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("%s: events: bad line: %v: %w", c.where, err, errdefs.ErrUnavailable)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return sc.Err()
}

// Metrics returns the Prometheus text of /metrics.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	req, err := c.request(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", c.transportErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", c.problem(resp)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return string(b), err
}

// DialTimeout bounds how long finding out whether a daemon answers takes.
const DialTimeout = 2 * time.Second

// call is do for the routes that answer one JSON object of type T.
func call[T any](ctx context.Context, c *Client, method, path string, body any) (*T, error) {
	var out T
	return &out, c.do(ctx, method, path, body, &out)
}
