package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/server"
)

// service is what the commands need of turnsnap. Two things satisfy it:
// server.Service over an engine this process opened (direct mode), and
// client.Client, which asks the daemon serving the home. Both return the
// same wire types, and the commands print those, so a command's output,
// --json and exit code are the same either way. A command written against
// service is written once.
type service interface {
	CreateSandbox(ctx context.Context, req api.CreateRequest) (*api.Created, error)
	ListSandboxes(ctx context.Context) ([]api.Sandbox, error)
	SandboxPath(ctx context.Context, name string) (*api.SandboxPath, error)
	RemoveSandbox(ctx context.Context, name string, catalogOnly bool) (*api.Removed, error)
	ResumeSandbox(ctx context.Context, name string) (*api.Resumed, error)
	AdoptSandbox(ctx context.Context, name string, req api.AdoptRequest) (*api.Adopted, error)
	Exec(ctx context.Context, name string, req api.ExecRequest, stdio api.Stdio) (*api.Exited, error)
	Checkpoint(ctx context.Context, name string, req api.CheckpointRequest) (*api.Checkpoint, error)
	Log(ctx context.Context, name string) ([]api.LogEntry, error)
	Diff(ctx context.Context, name, from, to string) (*api.Diff, error)
	Rollback(ctx context.Context, name string, req api.RollbackRequest) (*api.Restore, error)
	Branch(ctx context.Context, ref string, req api.BranchRequest) ([]api.Restore, error)
	Verify(ctx context.Context, ref string) (*api.Verified, error)
	VerifyStore(ctx context.Context, req api.StoreVerifyRequest) (*api.StoreVerified, error)
	Tags(ctx context.Context) ([]api.Tag, error)
	SetTag(ctx context.Context, name string, req api.TagRequest) (*api.Tagged, error)
	DeleteTag(ctx context.Context, name string) (*api.Untagged, error)
	Status(ctx context.Context) (*api.StatusReport, error)
	Sync(ctx context.Context, req api.SyncRequest) (*api.Synced, error)
	Prune(ctx context.Context, req api.PruneRequest) (*api.Pruned, error)
	GC(ctx context.Context, req api.GCRequest) (*api.GCReport, error)
	Init(ctx context.Context, req api.InitRequest) (*api.Initialised, error)
	RebuildCatalog(ctx context.Context, req api.RebuildRequest) (*api.Rebuilt, error)
	everydayService
}

// everydayService is the everyday commands' part of service
// (server/everyday.go).
type everydayService interface {
	DiffPaths(ctx context.Context, name string, req api.DiffRequest) (*api.DiffResult, error)
	Cat(ctx context.Context, ref, path string, w io.Writer) error
	Ls(ctx context.Context, ref, path string) ([]api.LsEntry, error)
	RestorePaths(ctx context.Context, name string, req api.RestorePathsRequest) (*api.RestorePathsResult, error)
	Lineage(ctx context.Context) (*api.Lineage, error)
	Audit(ctx context.Context, name string) (*api.AuditReport, error)
	Processes(ctx context.Context, name string) (*api.ProcessList, error)
	Forget(ctx context.Context, req api.ForgetRequest) (*api.Forgotten, error)
	ApplyPolicies(ctx context.Context, req api.ApplyPoliciesRequest) (*api.Forgotten, error)
	ShowPolicies(ctx context.Context, sandbox string) (*api.PolicyView, error)
	SetPolicy(ctx context.Context, req api.PolicyOptions) (*api.PolicyView, error)
	ClearPolicy(ctx context.Context, sandbox string) (*api.PolicyView, error)
}

var (
	_ service = (*server.Service)(nil)
	_ service = (*client.Client)(nil)
)

// socketName is the daemon's unix socket inside the home.
const socketName = "turnsnap.sock"

// daemon returns a client of the daemon serving this invocation: the one
// --daemon names, or the one answering on the home's socket. It returns
// nil (direct mode) when no daemon answers there.
func (a *app) daemon(ctx context.Context) (*client.Client, error) {
	if a.daemonURL != "" {
		token := ""
		if a.daemonTokenFile != "" {
			b, err := os.ReadFile(a.daemonTokenFile)
			if err != nil {
				return nil, fmt.Errorf("--daemon-token-file: %v: %w", err, errdefs.ErrInvalid)
			}
			token = strings.TrimSpace(string(b))
		}
		return client.New(client.Options{URL: a.daemonURL, Token: token})
	}
	sock := filepath.Join(a.home, socketName)
	if _, err := os.Stat(sock); err != nil {
		return nil, nil
	}
	c, err := client.New(client.Options{Socket: sock})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, client.DialTimeout)
	defer cancel()
	if err := c.Ping(pctx); err != nil {
		// A socket a killed daemon left: nobody answers, so this process
		// may own the home (its flock says for sure).
		a.log.Debug("no daemon answers; direct mode", "socket", sock, "err", err)
		return nil, nil
	}
	return c, nil
}

// withService runs fn through the daemon if one serves the home, else on
// the home opened directly (read-only when ro says the invocation only
// reads; ro nil: never).
func (a *app) withService(ro func(args []string) bool, fn func(ctx context.Context, s service, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		c, err := a.daemon(ctx)
		if err != nil {
			return err
		}
		if c != nil {
			return fn(ctx, c, args)
		}
		return a.openDirect(ro, func(ctx context.Context, e *engine.Engine, args []string) error {
			// The home is free while an exec'd command runs: an agent's test
			// suite must not block `turnsnap status` from another terminal.
			svc := &server.Service{E: e, BeforeExec: e.Close}
			if pr := a.newProgress(ctx); pr != nil {
				svc.PushProgress = pr.uploads
				defer pr.done()
			}
			return fn(ctx, svc, args)
		})(cmd, args)
	}
}

// refuseIfServed fails a command that must own the home itself (unlock,
// key rotate) while a daemon serves
// the home, saying what to do.
func (a *app) refuseIfServed(cmd *cobra.Command) error {
	c, err := a.daemon(cmd.Context())
	if err != nil {
		return err
	}
	if c != nil {
		return fmt.Errorf("%s must own the home, and a daemon (turnsnap serve) serves %s: stop it first (systemctl stop turnsnap), run the command, start it again: %w",
			cmd.CommandPath(), a.home, errdefs.ErrUnavailable)
	}
	return nil
}

// reportError prints a failed command's error: on stderr, and with --json
// also as {"error": {"class": ..., "message": ...}} on stdout, so a script
// reading stdout sees what failed. It returns the exit code.
func reportError(stdout, stderr io.Writer, asJSON bool, err error) int {
	var ce commandExit
	if errors.As(err, &ce) {
		return ce.code
	}
	if errors.Is(err, errNotRoot) {
		fmt.Fprintln(stderr, err) // the sentence names turnsnap already
	} else {
		fmt.Fprintln(stderr, "turnsnap:", err)
	}
	code := exitCode(err)
	if code == exitError && usageErr(err) {
		code = exitUsage
	}
	if asJSON {
		class := errdefs.Class(err)
		if code == exitUsage {
			class = "invalid"
		}
		e := map[string]any{"class": class, "message": err.Error()}
		// A restore_incomplete restore's receipt says what differs.
		var ri *engine.RestoreIncompleteError
		var p *api.Problem
		if errors.As(err, &ri) {
			e["receipt"], e["state"] = ri.Receipt, ri.State
		} else if errors.As(err, &p) && p.Receipt != nil {
			e["receipt"], e["state"] = p.Receipt, p.State
		}
		data, _ := json.Marshal(map[string]any{"error": e})
		fmt.Fprintln(stdout, string(data))
	}
	return code
}
