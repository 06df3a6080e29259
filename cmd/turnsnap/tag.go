package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (a *app) tagCmd() *cobra.Command {
	var del bool
	c := &cobra.Command{
		Use:   "tag [NAME [CHECKPOINT]]",
		Short: "Name a checkpoint (no arguments: list tags; --delete NAME: remove one)",
		Args:  cobra.MaximumNArgs(2),
	}
	c.RunE = a.withService(func(args []string) bool { return len(args) == 0 && !del }, func(ctx context.Context, s service, args []string) error {
		switch {
		case del && len(args) == 1:
			r, err := s.DeleteTag(ctx, args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			fmt.Fprintf(a.stdout(), "tag %s deleted\n", args[0])
			return nil
		case len(args) == 2 && !del:
			cp, err := s.SetTag(ctx, args[0], api.TagRequest{Checkpoint: args[1]})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), cp)
			}
			fmt.Fprintf(a.stdout(), "tag %s -> %s (sandbox %s, turn %d)\n", args[0], cp.Checkpoint.Short(), cp.Sandbox, cp.Turn)
			return nil
		case len(args) == 0 && !del:
			tags, err := s.Tags(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), tags)
			}
			tw := tabwriter.NewWriter(a.stdout(), 0, 4, 2, ' ', 0)
			for _, t := range tags {
				fmt.Fprintf(tw, "%s\t%s\n", t.Tag, t.Checkpoint.Short())
			}
			return tw.Flush()
		}
		return fmt.Errorf("usage: turnsnap tag NAME CHECKPOINT | turnsnap tag | turnsnap tag --delete NAME: %w", errdefs.ErrInvalid)
	})
	c.Flags().BoolVarP(&del, "delete", "d", false, "delete the named tag")
	return c
}
