// Command turnsnap checkpoints and restores AI-agent sandboxes one turn at a
// time. This file wires flags to the engine; behaviour lives in packages.
package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/testhook"
)

// Exit codes, one per error class, so scripts can branch without parsing text.
const (
	exitError        = 1
	exitUsage        = 2
	exitNotFound     = 3
	exitExists       = 4
	exitPrecondition = 5
	exitUnavailable  = 6
	exitCorrupt      = 7
	exitNoSpace      = 8
	exitKey          = 9
	// exitPartial is not an error class: the command did its work but left
	// out what it names (catalog rebuild: the objects it skipped).
	exitPartial = 10
	// exitRestoreIncomplete: a rollback or branch ran but its receipt
	// found the sandbox is not the checkpoint (errdefs.ErrRestoreIncomplete).
	exitRestoreIncomplete = 11
)

func exitCode(err error) int {
	var ce *engine.CommandError
	if errors.As(err, &ce) {
		return ce.Code // 127 not found, 126 not executable, as a shell
	}
	var p *api.Problem
	if errors.As(err, &p) && p.ExitCode != 0 {
		return p.ExitCode // the same, through the daemon
	}
	switch {
	case errors.Is(err, errdefs.ErrRestoreIncomplete):
		return exitRestoreIncomplete
	case errors.Is(err, errdefs.ErrKey):
		// First: a sealed object that does not open is a key problem even
		// where it surfaces as a corrupt read.
		return exitKey
	case errors.Is(err, errdefs.ErrCorrupt):
		// Before the rest: damaged stored data is the finding even when
		// decoding it also failed a validity check (a ref that is not an id).
		return exitCorrupt
	case errors.Is(err, errdefs.ErrInvalid):
		return exitUsage
	case errors.Is(err, errdefs.ErrNotFound):
		return exitNotFound
	case errors.Is(err, errdefs.ErrExists):
		return exitExists
	case errors.Is(err, errdefs.ErrPrecondition):
		return exitPrecondition
	case errors.Is(err, errdefs.ErrUnavailable):
		return exitUnavailable
	case errors.Is(err, errdefs.ErrNoSpace), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return exitNoSpace
	}
	return exitError
}

// app holds the global flags shared by every subcommand.
type app struct {
	home     string
	json     bool
	lockWait time.Duration
	verbose  bool
	log      *slog.Logger
	w        io.Writer
	// daemonURL and daemonTokenFile reach a daemon over TCP (--daemon).
	daemonURL, daemonTokenFile string
}

func defaultHome() string {
	if h := os.Getenv("TURNSNAP_HOME"); h != "" {
		return h
	}
	return "/var/lib/turnsnap"
}

// withEngine runs fn with the home opened and closed around it, showing
// progress on a terminal while fn works.
func (a *app) withEngine(fn func(ctx context.Context, e *engine.Engine, args []string) error) func(*cobra.Command, []string) error {
	return a.withEngineIf(nil, fn)
}

// withEngineIf opens the home read-only when ro says the invocation only
// reads (ro nil: never). A command written this way needs the home itself:
// while a daemon serves the home it is refused, naming the daemon (route
// it through the service interface, service.go, to make it work there).
func (a *app) withEngineIf(ro func(args []string) bool, fn func(ctx context.Context, e *engine.Engine, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := a.refuseIfServed(cmd); err != nil {
			return err
		}
		return a.openDirect(ro, fn)(cmd, args)
	}
}

// openDirect runs fn with the home opened and closed around it, showing
// progress on a terminal while fn works.
func (a *app) openDirect(ro func(args []string) bool, fn func(ctx context.Context, e *engine.Engine, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		// FreezeOnBranch: the process would wait for each checkpoint's
		// background freeze before it exits.
		opts := engine.Options{Home: a.home, LockWait: a.lockWait, Logger: a.log, AtPhase: blockAtPhase(),
			ReadOnly: ro != nil && ro(args), FreezeOnBranch: true}
		pr := a.newProgress(ctx)
		if pr != nil {
			opts.Progress = pr.update
			a.w = &afterProgress{w: a.w, pr: pr}
		}
		e, err := engine.Open(ctx, opts)
		if err != nil {
			return err
		}
		defer closeDirect(e)
		err = fn(ctx, e, args)
		pr.done()
		return err
	}
}

// closeDirect closes an engine the command opened, once the layers its
// checkpoints queued are frozen: Close would cancel them, and in direct
// mode only the freezes worth their cost are queued (FreezeOnBranch).
func closeDirect(e *engine.Engine) {
	e.WaitFreezes()
	// A lazy restore's files are filled by this process: without it their
	// first access would read placeholders.
	if err := e.Lazy().WaitAll(context.Background()); err != nil {
		slog.Error("lazy restore", "err", err)
	}
	e.Close()
}

func (a *app) stdout() io.Writer { return a.w }

// blockAtPhase is the test hook that stops a command at a phase
// (internal/testhook: compiled in only under the turnsnaptest build tag).
func blockAtPhase() func(string) { return testhook.BlockAt() }

func newRoot() *cobra.Command {
	a := &app{}
	root := &cobra.Command{
		Use:   "turnsnap",
		Short: "Checkpoint and restore agent sandboxes, one turn at a time",
		Long: `turnsnap keeps every agent turn recoverable: checkpoint a sandbox at each turn
boundary (turns that changed nothing cost nothing), roll back a failed edit,
branch one checkpoint into many sandboxes, and verify what is stored.

Exit codes: 0 success, 1 other error, 2 invalid arguments, 3 not found,
4 already exists, 5 failed precondition, 6 unavailable (locked), 7 corrupt
data, 8 no space, 9 missing or wrong key, 10 partial (catalog rebuild
restored what it could and named what it skipped), 11 restore incomplete
(a rollback or branch whose receipt found the sandbox is not the
checkpoint; the error names the state it was left in); exec and run: the
command's own status.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			a.w = cmd.OutOrStdout()
			level := slog.LevelWarn
			if a.verbose {
				level = slog.LevelDebug
			}
			a.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			return needRoot(cmd)
		},
	}
	root.AddCommand(a.forgetCmd(), a.policyCmd(), a.psCmd()) // retention and processes (issue 16)
	pf := root.PersistentFlags()
	pf.StringVar(&a.home, "home", defaultHome(), "turnsnap home directory (env TURNSNAP_HOME)")
	pf.BoolVar(&a.json, "json", false, "print results as JSON")
	pf.DurationVar(&a.lockWait, "lock-wait", engine.DefaultLockWait, "how long to wait for another turnsnap process using the same home")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "log debug detail to stderr")
	pf.StringVar(&a.daemonURL, "daemon", os.Getenv("TURNSNAP_DAEMON"), "URL of a TCP daemon to use (env TURNSNAP_DAEMON; default: the home's socket if a daemon answers there, else direct)")
	pf.StringVar(&a.daemonTokenFile, "daemon-token-file", os.Getenv("TURNSNAP_DAEMON_TOKEN_FILE"), "file holding the bearer token of the --daemon")
	root.AddCommand(a.sandboxCmd(), a.checkpointCmd(), a.logCmd(), a.diffCmd(), a.rollbackCmd(),
		a.branchCmd(), a.tagCmd(), a.verifyCmd(), a.catalogCmd(), a.initCmd(), a.syncCmd(),
		a.statusCmd(), a.unlockCmd(), a.gcCmd(), a.pruneCmd(), a.execCmd(), a.demoCmd(), a.keyCmd(),
		a.catCmd(), a.lsCmd(), a.restoreCmd(), a.serveCmd(), a.runCmd(), a.llmCmd(), a.benchCmd(), a.auditCmd(), a.mcpCmd(), a.controllerCmd())
	return root
}

// errNotRoot is said at once, before a command fails on some file deep
// inside with "operation not permitted".
var errNotRoot error = notRoot{}

type notRoot struct{}

func (notRoot) Error() string { return "turnsnap must run as root: overlay mounts, runc, CRIU" }
func (notRoot) Unwrap() error { return errdefs.ErrPrecondition }

// needRoot refuses every command but the few that touch no sandbox (help,
// shell completion, generating a key file) when not run as root.
func needRoot(cmd *cobra.Command) error {
	if os.Geteuid() == 0 {
		return nil
	}
	switch cmd.CommandPath() {
	case "turnsnap", "turnsnap help", "turnsnap key generate", "turnsnap controller":
		return nil
	}
	if p := cmd.Parent(); p != nil && p.Name() == "completion" || cmd.Name() == "completion" {
		return nil
	}
	return errNotRoot
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	if err := root.ExecuteContext(ctx); err != nil {
		asJSON := false
		if f := root.PersistentFlags().Lookup("json"); f != nil {
			asJSON = f.Value.String() == "true"
		}
		os.Exit(reportError(os.Stdout, os.Stderr, asJSON, err))
	}
}
