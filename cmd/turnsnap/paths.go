package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
)

// One path at a time: cat, ls and restore of chosen paths.

func (a *app) catCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cat CHECKPOINT PATH",
		Short: "Write a file's bytes as they were in a checkpoint to stdout",
		Long: `cat writes the content of the file PATH (an in-sandbox path such as
/etc/app.conf) as it was in CHECKPOINT (an id, a unique prefix of 4 or more
hex digits, a tag, or NAME@HEAD, each with an optional ~N: N first parents
back) to stdout. Every chunk is checked against its hash as
it is read: a damaged one stops the output and exits 7 naming the object,
so a partial file never exits 0. A directory, symlink or special file is
exit 2 (list directories with ls), a missing path exit 3.`,
		Args: cobra.ExactArgs(2),
		RunE: a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
			w := &countingWriter{w: a.stdout()}
			if err := s.Cat(ctx, args[0], args[1], w); err != nil {
				if w.n > 0 {
					return fmt.Errorf("%w (output incomplete: %d bytes written before the error)", err, w.n)
				}
				return err
			}
			return nil
		}),
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func (a *app) lsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls CHECKPOINT [PATH]",
		Short: "List a directory of a checkpoint (mode, owner, size, mtime, name)",
		Long: `ls lists the directory PATH (default: the root) as it was in CHECKPOINT,
sorted by name: mode, owner, size, modification time and name, with a
symlink's target and a hardlink's primary after "->". A PATH that is not a
directory lists that one entry. --json gives every field; a name that is not
valid UTF-8 also comes as name_b64 (its raw bytes, base64).`,
		Args: cobra.RangeArgs(1, 2),
		RunE: a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
			p := ""
			if len(args) == 2 {
				p = args[1]
			}
			entries, err := s.Ls(ctx, args[0], p)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), entries)
			}
			tw := tabwriter.NewWriter(a.stdout(), 0, 4, 1, ' ', tabwriter.AlignRight)
			for _, en := range entries {
				name := displayName(en.Name)
				if en.Target != "" {
					name += " -> " + displayName(en.Target)
				}
				fmt.Fprintf(tw, "%s\t %d\t %d\t %d\t %s\t  %s\n", en.Mode, en.UID, en.GID, en.Size,
					en.Mtime.Local().Format("2006-01-02 15:04:05"), name)
			}
			return tw.Flush()
		}),
	}
}

// displayName prints a name for a person: as it is, unless it holds bytes
// that would garble a terminal line (control characters, invalid UTF-8),
// which are quoted Go-style. Scripts use --json or diff -z.
func displayName(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return strconv.Quote(s)
		}
	}
	return s
}

func (a *app) restoreCmd() *cobra.Command {
	var to string
	c := &cobra.Command{
		Use:   "restore NAME CHECKPOINT PATH... [--to DIR]",
		Short: "Put chosen paths back into a sandbox as they were in a checkpoint",
		Long: `restore puts each PATH (a file, a symlink or a whole directory) back into
sandbox NAME's live root exactly as it was in CHECKPOINT, with its metadata
(mode, owner, mtime, xattrs; hardlinks among the restored paths stay
hardlinks), and leaves every other path alone. A directory is restored
whole: what the live directory holds that the checkpoint's did not is
removed. A PATH the checkpoint does not have is removed from the sandbox
(reported as "removed"). Missing parent directories are created as they
were in the checkpoint; a parent that is now a file or a symlink is refused
(restore that parent instead), and nothing is ever written through a
symlink or outside the root. What is already as in the checkpoint (content
hashes and metadata equal) is left alone; every other entry is written under
a temporary name and renamed into place once complete, so a damaged
checkpoint (exit 7) leaves it as it was.

The sandbox's processes keep running; restore waits for any checkpoint of
the sandbox in progress and the next checkpoint records the restored paths
as an ordinary change (class fs). The head does not move. CHECKPOINT may
be any sandbox's. With --to DIR the paths are written below the host
directory DIR (created if missing) instead, and the sandbox is not touched;
while a daemon (turnsnap serve) serves the home, --to is refused (exit 2):
the daemon does not write into host directories a client names.`,
		Args: cobra.MinimumNArgs(3),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			r, err := s.RestorePaths(ctx, args[0], api.RestorePathsRequest{Checkpoint: args[1], Paths: args[2:], To: to})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			for _, p := range r.Paths {
				switch p.Action {
				case "restored":
					fmt.Fprintf(a.stdout(), "restored %s (%d entries written, %s; %d unchanged)\n", displayName(p.Path), p.Entries, bytesStr(p.Bytes), p.Unchanged)
				case "removed":
					fmt.Fprintf(a.stdout(), "removed  %s (not in checkpoint %s)\n", displayName(p.Path), r.Checkpoint.Short())
				default:
					fmt.Fprintf(a.stdout(), "absent   %s (in neither the checkpoint nor the target)\n", displayName(p.Path))
				}
			}
			fmt.Fprintf(a.stdout(), "%d paths from %s into %s in %s\n", len(r.Paths), r.Checkpoint.Short(), r.Target,
				durStr(api.Dur(r.DurationMS).Round(time.Microsecond)))
			return nil
		}),
	}
	c.Flags().StringVar(&to, "to", "", "write the paths below this host directory instead of the sandbox")
	return c
}
