package client

import (
	"context"
	"net/http"

	"github.com/turnsnap/turnsnap/engine/audit"
)

// Audit is api.Service.Audit through the daemon.
func (c *Client) Audit(ctx context.Context, name string) (*audit.Report, error) {
	var out audit.Report
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+esc(name)+"/audit", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
