package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (a *app) unlockCmd() *cobra.Command {
	var all, staleOnly bool
	c := &cobra.Command{
		Use:   "unlock [--stale-only|--all]",
		Short: "Remove the bucket's stale lock objects (left by a killed push or gc)",
		Long: `A push or gc holds a lock object in the bucket and refreshes it while it
works; a lock not refreshed within the window it states (1 minute by
default, remote.lock_stale_after_ns) is stale and every host ignores it. On
the holder's own machine a lock is stale as soon as its process has ended
(same hostname, boot id and pid namespace; the pid no longer runs, or runs
another process). unlock removes stale locks at once (the default,
--stale-only). --all removes every lock, including those of operations
still running on some host: use it only when none is.`,
		Args: cobra.NoArgs,
	}
	c.RunE = a.withEngine(func(ctx context.Context, e *engine.Engine, _ []string) error {
		if all && staleOnly {
			return fmt.Errorf("unlock: --all and --stale-only exclude each other: %w", errdefs.ErrInvalid)
		}
		removed, err := e.Remote().Unlock(ctx, all)
		if err != nil {
			return err
		}
		if a.json {
			if removed == nil {
				removed = []engine.LockInfo{}
			}
			return printJSON(a.stdout(), map[string]any{"removed": removed})
		}
		for _, l := range removed {
			state := "stale"
			switch {
			case l.HolderGone:
				state = "stale, its holder has ended"
			case !l.Stale:
				state = "live"
			}
			fmt.Fprintf(a.stdout(), "removed %s (%s, %s by %s pid %d, refreshed %s ago)\n",
				l.Name, state, l.Kind, l.Host, l.PID, time.Since(l.Refreshed).Round(time.Second))
		}
		fmt.Fprintf(a.stdout(), "%d lock(s) removed\n", len(removed))
		return nil
	})
	c.Flags().BoolVar(&all, "all", false, "remove every lock, live ones too")
	c.Flags().BoolVar(&staleOnly, "stale-only", false, "remove only stale locks (the default)")
	return c
}
