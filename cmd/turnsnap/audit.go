package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine/audit"
)

func (a *app) auditCmd() *cobra.Command {
	var html bool
	c := &cobra.Command{
		Use:   "audit NAME",
		Short: "Show per turn what changed, what it cost, and what weaker recovery would have lost",
		Long: `audit walks the sandbox's head lineage, oldest first. For every checkpoint it
shows the files added, modified and deleted since the turn before (sizes,
metadata changes), the state of the process image (started, changed,
unchanged, ended), the class and the cost (bytes stored, time, pause), and
what each weaker recovery would have lost had the sandbox crashed right
after that turn: chat-only recovery everything since the base, chat+fs
recovery the processes and their memory. --json prints the report as one
object; --html prints one self-contained page. Through the daemon when one
serves the home (GET /v1/sandboxes/NAME/audit), else read-only on the home.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
			rep, err := s.Audit(ctx, args[0])
			if err != nil {
				return err
			}
			switch {
			case html:
				return audit.WriteHTML(a.stdout(), args[0], rep)
			case a.json:
				return printJSON(a.stdout(), rep)
			}
			return printAudit(a, rep)
		}),
	}
	c.Flags().BoolVar(&html, "html", false, "print one self-contained HTML page")
	return c
}

func printAudit(a *app, rep *api.AuditReport) error {
	w := a.stdout()
	fmt.Fprintf(w, "sandbox %s: %d checkpoints, %s stored\n", rep.Sandbox, rep.Totals.Turns, bytesStr(rep.Totals.BytesNew))
	for _, t := range rep.Turns {
		fmt.Fprintf(w, "\nturn %d  %-7s %s  %s stored, %.1fms", t.Turn, t.Class, t.Checkpoint.Short(), bytesStr(t.BytesNew), t.DurationMS)
		if t.Message != "" {
			fmt.Fprintf(w, "  %q", t.Message)
		}
		fmt.Fprintf(w, "\n  files: %d added, %d modified, %d deleted; processes: %s", t.Added, t.Modified, t.Deleted, t.Processes.State)
		if t.Processes.Why != "" {
			fmt.Fprintf(w, " (%s)", t.Processes.Why)
		}
		fmt.Fprintln(w)
		for i, f := range t.Files {
			if i == 20 {
				fmt.Fprintf(w, "    ... %d more (see --json)\n", len(t.Files)-20)
				break
			}
			extra, what := "", f.Meta
			if f.Content {
				what = append([]string{"content"}, what...)
			}
			if len(what) > 0 {
				extra = " (" + strings.Join(what, ", ") + ")"
			}
			fmt.Fprintf(w, "    %-8s %s %s%s\n", f.Change, f.Path, bytesStr(int64(f.Size)), extra)
		}
		fmt.Fprintf(w, "  chat-only would lose: %s\n  chat+fs would lose: %s\n", t.ChatOnlyLoses.Summary, t.ChatFSLoses.Summary)
	}
	return nil
}
