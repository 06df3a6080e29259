package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// The everyday commands' routes (server/everyday.go).

func (c *Client) DiffPaths(ctx context.Context, name string, req api.DiffRequest) (*api.DiffResult, error) {
	q := url.Values{}
	if req.From != "" {
		q.Set("from", req.From)
	}
	if req.To != "" {
		q.Set("to", req.To)
	}
	if req.Patch {
		q.Set("patch", "true")
	}
	p := "/v1/sandboxes/" + esc(name) + "/diff"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var out api.DiffResult
	return &out, c.do(ctx, http.MethodGet, p, nil, &out)
}

// Cat streams the file at path in checkpoint ref to w as the daemon sends
// it. As with paths.Ops.Cat, an error after w got bytes means the output is
// incomplete: a chunk that failed its hash on the daemon comes back as the
// daemon's corrupt error (from the response's trailer), a cut connection
// as ErrUnavailable.
func (c *Client) Cat(ctx context.Context, ref, path string, w io.Writer) error {
	req, err := c.request(ctx, http.MethodGet, "/v1/checkpoints/"+esc(ref)+"/content?path="+url.QueryEscape(path), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/octet-stream")
	req.Header.Set("TE", "trailers") // a damaged chunk's error comes in the trailer
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.transportErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c.problem(resp)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: cat of %s in checkpoint %s: %v: %w", c.where, path, ref, err, errdefs.ErrUnavailable)
	}
	// The trailer is read with the body's end.
	return catTrailerError(resp.Trailer, ref, path)
}

func (c *Client) Ls(ctx context.Context, ref, path string) ([]api.LsEntry, error) {
	p := "/v1/checkpoints/" + esc(ref) + "/entries"
	if path != "" {
		p += "?path=" + url.QueryEscape(path)
	}
	var out []api.LsEntry
	return out, c.do(ctx, http.MethodGet, p, nil, &out)
}

func (c *Client) RestorePaths(ctx context.Context, name string, req api.RestorePathsRequest) (*api.RestorePathsResult, error) {
	return call[api.RestorePathsResult](ctx, c, http.MethodPost, "/v1/sandboxes/"+esc(name)+"/restore", req)
}

func (c *Client) Lineage(ctx context.Context) (*api.Lineage, error) {
	return call[api.Lineage](ctx, c, http.MethodGet, "/v1/lineage", nil)
}

func (c *Client) Processes(ctx context.Context, name string) (*api.ProcessList, error) {
	return call[api.ProcessList](ctx, c, http.MethodGet, "/v1/sandboxes/"+esc(name)+"/ps", nil)
}

func (c *Client) Forget(ctx context.Context, req api.ForgetRequest) (*api.Forgotten, error) {
	return call[api.Forgotten](ctx, c, http.MethodPost, "/v1/forget", req)
}

func (c *Client) ApplyPolicies(ctx context.Context, req api.ApplyPoliciesRequest) (*api.Forgotten, error) {
	return call[api.Forgotten](ctx, c, http.MethodPost, "/v1/policies/apply", req)
}

func policyQuery(sandbox string) string {
	if sandbox == "" {
		return "/v1/policies"
	}
	return "/v1/policies?sandbox=" + url.QueryEscape(sandbox)
}

func (c *Client) ShowPolicies(ctx context.Context, sandbox string) (*api.PolicyView, error) {
	return call[api.PolicyView](ctx, c, http.MethodGet, policyQuery(sandbox), nil)
}

func (c *Client) SetPolicy(ctx context.Context, req api.PolicyOptions) (*api.PolicyView, error) {
	return call[api.PolicyView](ctx, c, http.MethodPut, "/v1/policies", req)
}

func (c *Client) ClearPolicy(ctx context.Context, sandbox string) (*api.PolicyView, error) {
	return call[api.PolicyView](ctx, c, http.MethodDelete, policyQuery(sandbox), nil)
}

// catTrailerError turns a cat response's trailer back into its error: nil
// for a complete file, the problem for one cut off, and ErrUnavailable
// when the trailer is missing (the stream did not end as the server ends
// it).
func catTrailerError(tr http.Header, ref, path string) error {
	v, ok := tr[http.CanonicalHeaderKey(api.CatErrorTrailer)]
	if !ok {
		return fmt.Errorf("cat of %s in checkpoint %s: the stream ended without its trailer: %w", path, ref, errdefs.ErrUnavailable)
	}
	if len(v) == 0 || v[0] == "" {
		return fmt.Errorf("cat of %s in checkpoint %s: empty error trailer: %w", path, ref, errdefs.ErrUnavailable)
	}
	if v[0] == api.CatComplete {
		return nil
	}
	var p api.Problem
	if err := json.Unmarshal([]byte(v[0]), &p); err != nil || p.Detail == "" {
		return fmt.Errorf("cat of %s in checkpoint %s: bad error trailer %q: %w", path, ref, v[0], errdefs.ErrUnavailable)
	}
	return problemOf(&p)
}
