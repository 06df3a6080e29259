package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/turnsnap/turnsnap/api"
)

// printLineage is `log --all`: every checkpoint of the home, children
// before parents (api.Lineage).
func (a *app) printLineage(ctx context.Context, s service, graph bool) error {
	l, err := s.Lineage(ctx)
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(a.stdout(), l)
	}
	nodes := make([]graphNode, len(l.Checkpoints))
	for i, c := range l.Checkpoints {
		nodes[i] = graphNode{id: c.ID, parent: c.Parent, line: lineageLine(c)}
	}
	if graph {
		drawGraph(a.stdout(), nodes)
		return nil
	}
	for _, n := range nodes {
		fmt.Fprintln(a.stdout(), n.line)
	}
	return nil
}

func lineageLine(c api.LineageEntry) string {
	s := fmt.Sprintf("%s  turn %-3d %-4s %9s  %s  [%s]", c.ID.Short(), c.Turn, c.Class, bytesStr(c.BytesNew),
		c.Created.Local().Format("2006-01-02 15:04:05"), c.Sandbox)
	var tags []string
	if c.Removed {
		tags = append(tags, "sandbox removed")
	}
	for _, h := range c.Heads {
		tags = append(tags, "HEAD of "+h)
	}
	if len(c.Branches) > 0 {
		tags = append(tags, "branched: "+strings.Join(c.Branches, ", "))
	}
	if len(tags) > 0 {
		s += "  (" + strings.Join(tags, ", ") + ")"
	}
	if c.Message != "" {
		s += "  " + c.Message
	}
	return s
}

// graphNode is one row of drawGraph.
type graphNode struct {
	id, parent api.ID
	line       string
}

// drawGraph draws a lineage the way `git log --graph` draws a history
// without merges: one column per line of descent still waiting for its
// parent. nodes must list every child before its parent.
func drawGraph(w io.Writer, nodes []graphNode) {
	listed := make(map[api.ID]bool, len(nodes))
	for _, n := range nodes {
		listed[n.id] = true
	}
	var cols []api.ID // what each column waits for
	for _, l := range nodes {
		first := -1
		var mine []int
		for i, c := range cols {
			if c == l.id {
				mine = append(mine, i)
				if first < 0 {
					first = i
				}
			}
		}
		if first < 0 {
			cols = append(cols, l.id)
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
		fmt.Fprintf(w, "%s%s\n", row.String(), l.line)
		cols[first] = l.parent
		if !listed[l.parent] { // a root, or a parent pruned away: the line ends
			cols = append(cols[:first], cols[first+1:]...)
		}
	}
}
