package client

import (
	"context"
	"net/http"

	"github.com/turnsnap/turnsnap/api"
)

// Audit is server.Service.Audit through the daemon.
func (c *Client) Audit(ctx context.Context, name string) (*api.AuditReport, error) {
	var out api.AuditReport
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+esc(name)+"/audit", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
