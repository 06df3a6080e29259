package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
)

func (a *app) logCmd() *cobra.Command {
	var graph, all bool
	c := &cobra.Command{
		Use:   "log NAME [--graph] | log --all [--graph]",
		Short: "Show a sandbox's checkpoints (or the whole home's with --all), newest first",
		Long: `log lists a sandbox's checkpoints newest first: its head and the head's
ancestors (across the checkpoint it was branched from), and its own
checkpoints a rollback left behind. "branched: B" marks a checkpoint that
another sandbox B continues from (branched from it, rolled back to it, or
took a checkpoint on top of it).

--all lists every checkpoint of the home, every sandbox's, with the same
marks and "HEAD of A" where sandbox A's head is. The order is newest first,
except that a checkpoint is always printed after all of its children, so a
parent never appears above its child even when two hosts' clocks disagree.
--graph draws the lines of descent.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if all {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
	}
	lineage := a.withService(readOnly, func(ctx context.Context, s service, _ []string) error {
		return a.printLineage(ctx, s, graph)
	})
	logOne := a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
		entries, err := s.Log(ctx, args[0])
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), entries)
		}
		if graph {
			printGraph(a.stdout(), entries)
			return nil
		}
		for _, l := range entries {
			fmt.Fprintln(a.stdout(), logLine(l))
		}
		return nil
	})
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if all {
			return lineage(cmd, args)
		}
		return logOne(cmd, args)
	}
	c.Flags().BoolVar(&graph, "graph", false, "draw the lineage as a graph")
	c.Flags().BoolVar(&all, "all", false, "every sandbox's checkpoints, with where each branched off")
	return c
}

func logLine(l api.LogEntry) string {
	var tags []string
	if l.Head {
		tags = append(tags, "HEAD")
	}
	if !l.OnHead {
		tags = append(tags, "rolled back")
	}
	s := fmt.Sprintf("%s  turn %-3d %-4s %9s  %s", l.ID.Short(), l.Turn, l.Class, bytesStr(l.BytesNew),
		l.Created.Local().Format("2006-01-02 15:04:05"))
	if l.Sandbox != "" {
		s += "  [" + l.Sandbox + "]"
	}
	if len(l.Branches) > 0 {
		tags = append(tags, "branched: "+strings.Join(l.Branches, ", "))
	}
	if len(tags) > 0 {
		s += "  (" + strings.Join(tags, ", ") + ")"
	}
	if l.Conv != nil && len(*l.Conv) >= 8 {
		s += "  model call " + l.Conv.String()[:8]
	}
	if l.Message != "" {
		s += "  " + l.Message
	}
	return s
}

// printGraph draws a sandbox's lineage (drawGraph).
func printGraph(w io.Writer, entries []api.LogEntry) {
	nodes := make([]graphNode, len(entries))
	for i, l := range entries {
		nodes[i] = graphNode{id: l.ID, parent: l.Parent, line: logLine(l)}
	}
	drawGraph(w, nodes)
}
