package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/mcpserver"
	"github.com/turnsnap/turnsnap/server"
)

func (a *app) mcpCmd() *cobra.Command {
	var sandbox string
	c := &cobra.Command{
		Use:   "mcp --sandbox NAME",
		Short: "Serve one sandbox's checkpoint tools to an agent over MCP (stdio)",
		Long: `mcp speaks the Model Context Protocol on stdin and stdout, giving the agent
working in sandbox NAME its checkpoints as its own tools: checkpoint, log,
diff, cat, restore_paths, rollback and branch (docs/MCP.md). An MCP client
(Claude Code: claude mcp add turnsnap -- turnsnap mcp --sandbox NAME) starts
it and ends it by closing stdin.

Each tool call goes to the daemon if one serves the home, else opens the
home for that call only, like one CLI command: the home is not held
between calls. The daemon serves the same tools over streamable HTTP at
/v1/sandboxes/NAME/mcp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !delta.ValidRefName(sandbox) {
				return fmt.Errorf("mcp: --sandbox %q is not a sandbox name: %w", sandbox, errdefs.ErrInvalid)
			}
			srv := mcpserver.New(&perCallService{a: a}, sandbox, mcpserver.Options{Logger: a.log, Version: buildVersion()})
			err := srv.Run(cmd.Context(), &mcp.StdioTransport{})
			if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
				return nil // the client closed stdin, or the process was told to stop: the session is over
			}
			return err
		},
	}
	c.Flags().StringVar(&sandbox, "sandbox", "", "the sandbox the tools act on")
	c.MarkFlagRequired("sandbox")
	return c
}

// mcpHandler is the daemon's MCP endpoint (server.Options.MCP): the tools
// over streamable HTTP, on the server's own service.
func mcpHandler(log *slog.Logger) func(*server.Service) http.Handler {
	return func(s *server.Service) http.Handler {
		return mcpserver.Handler(s, mcpserver.Options{Logger: log, Version: buildVersion()})
	}
}

// buildVersion is the module version the binary was built from ("(devel)"
// from a work tree), for the MCP handshake.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// perCallService is mcpserver.Service for a long-lived `turnsnap mcp`:
// each call goes through the daemon if one answers now, or opens the home
// for that call alone. An MCP session lasts as long as the agent's, and
// holding the home's lock for all of it would lock out every other
// command (and a daemon started later) for that long.
type perCallService struct {
	a *app
}

var _ mcpserver.Service = (*perCallService)(nil)

func (p *perCallService) with(ctx context.Context, readOnly bool, fn func(s mcpserver.Service) error) error {
	c, err := p.a.daemon(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return fn(c)
	}
	// FreezeOnBranch: as for the CLI, a process that exits after the call
	// keeps no frozen layers unless the sandbox is branched.
	e, err := engine.Open(ctx, engine.Options{Home: p.a.home, LockWait: p.a.lockWait, Logger: p.a.log,
		AtPhase: blockAtPhase(), ReadOnly: readOnly, FreezeOnBranch: true})
	if err != nil {
		return err
	}
	defer closeDirect(e)
	return fn(&server.Service{E: e})
}

func (p *perCallService) Checkpoint(ctx context.Context, name string, req api.CheckpointRequest) (r *api.Checkpoint, err error) {
	err = p.with(ctx, false, func(s mcpserver.Service) error { r, err = s.Checkpoint(ctx, name, req); return err })
	return r, err
}

func (p *perCallService) Log(ctx context.Context, name string) (r []api.LogEntry, err error) {
	err = p.with(ctx, true, func(s mcpserver.Service) error { r, err = s.Log(ctx, name); return err })
	return r, err
}

func (p *perCallService) DiffPaths(ctx context.Context, name string, req api.DiffRequest) (r *api.DiffResult, err error) {
	err = p.with(ctx, true, func(s mcpserver.Service) error { r, err = s.DiffPaths(ctx, name, req); return err })
	return r, err
}

func (p *perCallService) Cat(ctx context.Context, ref, path string, w io.Writer) error {
	return p.with(ctx, true, func(s mcpserver.Service) error { return s.Cat(ctx, ref, path, w) })
}

func (p *perCallService) RestorePaths(ctx context.Context, name string, req api.RestorePathsRequest) (r *api.RestorePathsResult, err error) {
	err = p.with(ctx, false, func(s mcpserver.Service) error { r, err = s.RestorePaths(ctx, name, req); return err })
	return r, err
}

func (p *perCallService) Rollback(ctx context.Context, name string, req api.RollbackRequest) (r *api.Restore, err error) {
	err = p.with(ctx, false, func(s mcpserver.Service) error { r, err = s.Rollback(ctx, name, req); return err })
	return r, err
}

func (p *perCallService) Branch(ctx context.Context, ref string, req api.BranchRequest) (r []api.Restore, err error) {
	err = p.with(ctx, false, func(s mcpserver.Service) error { r, err = s.Branch(ctx, ref, req); return err })
	return r, err
}
