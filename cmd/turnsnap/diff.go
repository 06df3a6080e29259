package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (a *app) diffCmd() *cobra.Command {
	var stat, patch, nul bool
	c := &cobra.Command{
		Use:   "diff NAME [FROM [TO]] [--stat | -p | -z]",
		Short: "Show what changed: paths, metadata, sizes, patches (default: head against the live root)",
		Long: `diff compares two states of sandbox NAME: FROM and TO name checkpoints (an
id, a unique prefix, a tag, HEAD or NAME@HEAD, each with an optional ~N: N
first parents back); FROM defaults to the head and TO to the live
root as it is now. Each changed path is a line "A /path" (added), "M /path"
(modified) or "D /path" (deleted); a modified entry is followed by indented
lines naming what changed: type, mode, owner, mtime, xattr, target (of a
symlink or hardlink), rdev, content. Directory mtimes alone are not changes
(they move whenever a child does, which is listed on its own), the same
rule checkpoint classes follow: a turn is class fs exactly when its diff is
not empty.

  --stat  sizes of each changed file and a summary line
  -p      a unified patch for each changed text file (UTF-8 without NUL,
          up to 1 MiB a side), a size line for others
  -z      names only, for scripts: "K" NUL "/path" NUL per change, raw bytes

Names with control characters or invalid UTF-8 are quoted in the text
forms. --json lists every change with its sizes, metadata changes and (with
-p) patch; a name that is not valid UTF-8 also comes as path_b64, its raw
bytes in base64 (README, "For scripts").`,
		Args: cobra.RangeArgs(1, 3),
	}
	c.RunE = a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
		if nul && (stat || patch || a.json) {
			return fmt.Errorf("diff: -z gives names only; it does not combine with --stat, -p or --json: %w", errdefs.ErrInvalid)
		}
		var from, to string
		if len(args) > 1 {
			from = args[1]
		}
		if len(args) > 2 {
			to = args[2]
		}
		r, err := s.DiffPaths(ctx, args[0], api.DiffRequest{From: from, To: to, Patch: patch})
		if err != nil {
			return err
		}
		w := a.stdout()
		if r.Interrupted != nil && !a.json {
			// On stderr: -z and --stat output stays parseable.
			fmt.Fprintf(os.Stderr, "sandbox %s: %s\n", r.Sandbox, r.Interrupted.Describe(r.Sandbox))
		}
		switch {
		case a.json:
			return printJSON(w, r)
		case nul:
			for _, c := range r.Paths {
				fmt.Fprintf(w, "%c\x00%s\x00", strings.ToUpper(c.Change)[0], c.Path)
			}
			return nil
		case stat:
			printDiffStat(w, r)
			return nil
		}
		for _, c := range r.Paths {
			fmt.Fprintf(w, "%c %s\n", strings.ToUpper(c.Change)[0], displayName(c.Path))
			for _, m := range c.Meta {
				fmt.Fprintf(w, "    %s\n", metaLine(m))
			}
			if patch {
				switch {
				case c.Patch != "":
					fmt.Fprint(w, c.Patch)
					if !strings.HasSuffix(c.Patch, "\n") {
						fmt.Fprintln(w)
					}
				case c.Binary:
					fmt.Fprintf(w, "    binary file: %s -> %s\n", sizeStr(c.OldSize), sizeStr(c.NewSize))
				}
			}
		}
		return nil
	})
	c.Flags().BoolVar(&stat, "stat", false, "show the size of each changed file and a summary")
	c.Flags().BoolVarP(&patch, "patch", "p", false, "show a unified patch for each changed text file")
	c.Flags().BoolVarP(&nul, "null", "z", false, "print kind and name of each change NUL-separated, for scripts")
	return c
}

func metaLine(m api.MetaChange) string {
	switch m.Field {
	case "xattr":
		switch {
		case m.Old == "":
			return fmt.Sprintf("xattr %s added: %s", m.Name, m.New)
		case m.New == "":
			return fmt.Sprintf("xattr %s removed (was %s)", m.Name, m.Old)
		}
		return fmt.Sprintf("xattr %s %s -> %s", m.Name, m.Old, m.New)
	case "content":
		return fmt.Sprintf("content %s -> %s bytes", m.Old, m.New)
	case "target":
		return fmt.Sprintf("target %s -> %s", displayName(m.Old), displayName(m.New))
	}
	return fmt.Sprintf("%s %s -> %s", m.Field, m.Old, m.New)
}

func sizeStr(n *uint64) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprintf("%d B", *n)
}

// printDiffStat prints one line per change with its sizes and a summary.
func printDiffStat(w io.Writer, r *api.DiffResult) {
	var added, modified, deleted int
	var grew, shrank uint64
	for _, c := range r.Paths {
		switch c.Change {
		case "added":
			added++
		case "modified":
			modified++
		default:
			deleted++
		}
		var a, b uint64
		if c.OldSize != nil {
			a = *c.OldSize
		}
		if c.NewSize != nil {
			b = *c.NewSize
		}
		delta := ""
		switch {
		case b > a:
			grew += b - a
			delta = fmt.Sprintf("  (+%d)", b-a)
		case a > b:
			shrank += a - b
			delta = fmt.Sprintf("  (-%d)", a-b)
		}
		fmt.Fprintf(w, "%c %s  %s -> %s%s\n", strings.ToUpper(c.Change)[0], displayName(c.Path), sizeStr(c.OldSize), sizeStr(c.NewSize), delta)
	}
	fmt.Fprintf(w, "%d paths changed: %d added, %d modified, %d deleted; +%d bytes, -%d bytes\n",
		len(r.Paths), added, modified, deleted, grew, shrank)
}
