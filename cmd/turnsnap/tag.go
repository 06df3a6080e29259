package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (a *app) tagCmd() *cobra.Command {
	var del bool
	c := &cobra.Command{
		Use:   "tag [NAME [CHECKPOINT]]",
		Short: "Name a checkpoint (no arguments: list tags; --delete NAME: remove one)",
		Args:  cobra.MaximumNArgs(2),
	}
	c.RunE = a.withEngineIf(func(args []string) bool { return len(args) == 0 && !del }, func(ctx context.Context, e *engine.Engine, args []string) error {
		switch {
		case del && len(args) == 1:
			if err := e.Untag(ctx, args[0]); err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{"tag": args[0], "deleted": true})
			}
			fmt.Fprintf(a.stdout(), "tag %s deleted\n", args[0])
			return nil
		case len(args) == 2 && !del:
			cp, err := e.Tag(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{"tag": args[0], "checkpoint": cp.ID, "turn": cp.Turn, "sandbox": cp.Sandbox})
			}
			fmt.Fprintf(a.stdout(), "tag %s -> %s (sandbox %s, turn %d)\n", args[0], cp.ID.Short(), cp.Sandbox, cp.Turn)
			return nil
		case len(args) == 0 && !del:
			tags, err := e.Tags(ctx)
			if err != nil {
				return err
			}
			if a.json {
				rows := []map[string]any{}
				for _, t := range tags {
					rows = append(rows, map[string]any{"tag": t.Name, "checkpoint": t.Target})
				}
				return printJSON(a.stdout(), rows)
			}
			tw := tabwriter.NewWriter(a.stdout(), 0, 4, 2, ' ', 0)
			for _, t := range tags {
				fmt.Fprintf(tw, "%s\t%s\n", t.Name, t.Target.Short())
			}
			return tw.Flush()
		}
		return fmt.Errorf("usage: turnsnap tag NAME CHECKPOINT | turnsnap tag | turnsnap tag --delete NAME: %w", errdefs.ErrInvalid)
	})
	c.Flags().BoolVarP(&del, "delete", "d", false, "delete the named tag")
	return c
}
