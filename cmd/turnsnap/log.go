package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/api"
)

func (a *app) logCmd() *cobra.Command {
	var graph bool
	c := &cobra.Command{
		Use:   "log NAME [--graph]",
		Short: "Show a sandbox's checkpoints, newest first",
		Args:  cobra.ExactArgs(1),
	}
	c.RunE = a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
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
	c.Flags().BoolVar(&graph, "graph", false, "draw the lineage as a graph")
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
	if len(tags) > 0 {
		s += "  (" + strings.Join(tags, ", ") + ")"
	}
	if l.Conv != nil {
		s += "  model call " + l.Conv.String()[:8]
	}
	if l.Message != "" {
		s += "  " + l.Message
	}
	return s
}

// printGraph draws the lineage the way `git log --graph` draws a history
// without merges: one column per line of descent still waiting for its
// parent, newest first.
func printGraph(w io.Writer, entries []api.LogEntry) {
	var cols []delta.ID // what each column waits for
	for _, l := range entries {
		first := -1
		var mine []int
		for i, c := range cols {
			if c == l.ID {
				mine = append(mine, i)
				if first < 0 {
					first = i
				}
			}
		}
		if first < 0 {
			cols = append(cols, l.ID)
			first = len(cols) - 1
			mine = []int{first}
		}
		// Lines of descent that share this checkpoint as parent join its
		// column first, so the row below them is where they meet.
		for j := len(mine) - 1; j >= 1; j-- {
			join := []byte(strings.Repeat("| ", mine[j]))
			join[2*mine[j]-1] = '/'
			fmt.Fprintln(w, string(join))
			cols = append(cols[:mine[j]], cols[mine[j]+1:]...)
		}
		var row strings.Builder
		for i := range cols {
			if i == first {
				row.WriteString("* ")
			} else {
				row.WriteString("| ")
			}
		}
		fmt.Fprintf(w, "%s%s\n", row.String(), logLine(l))
		cols[first] = l.Parent
		if l.Parent.IsZero() {
			cols = append(cols[:first], cols[first+1:]...)
		}
	}
}
