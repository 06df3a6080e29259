package server

import (
	"context"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
)

// Audit is GET /v1/sandboxes/{name}/audit: the sandbox's turns, what each
// changed and cost, and what weaker recovery would have lost
// (audit.Report, printed as is by `turnsnap audit --json`).
func (s *Service) Audit(ctx context.Context, name string) (*api.AuditReport, error) {
	sb, err := delta.ParseSandboxName(name)
	if err != nil {
		return nil, err
	}
	return wirePtr[api.AuditReport](s.E.History().Audit(ctx, sb))
}
