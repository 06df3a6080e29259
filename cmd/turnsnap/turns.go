package main

import (
	"context"
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// readOnly says an invocation only reads: in direct mode the home is
// opened read-only, so it works on a full or read-only home.
func readOnly([]string) bool { return true }

func (a *app) checkpointCmd() *cobra.Command {
	var turn int
	var message string
	var waitRemote, recordSkips bool
	c := &cobra.Command{
		Use:   "checkpoint NAME [--turn N] [--message TEXT] [--record-skips] [--wait-remote]",
		Short: "Close a turn: checkpoint what changed since the last checkpoint (nothing: skip)",
		Long: `checkpoint closes a turn: it scans what changed since the sandbox's head and
stores only that. A turn that changed nothing is a skip: it writes nothing
and prints the head's id. With --record-skips a skip turn writes a record of
its own (class skip, the head's trees, no new bytes), so the log has one
line per turn.

--turn N records the agent's own turn number (any N >= 0; numbers need not
be consecutive or unique): pass it on every call to keep the framework's
numbering. Without it the turn is the parent's turn plus one, so skip turns
that write no record leave no gap: the next checkpoint reuses the number.`,
		Args: cobra.ExactArgs(1),
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, args []string) error {
		req := api.CheckpointRequest{Message: message, WaitRemote: waitRemote, RecordSkips: recordSkips}
		if c.Flags().Changed("turn") {
			req.Turn = &turn
		}
		r, err := s.Checkpoint(ctx, args[0], req)
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), r)
		}
		where := ""
		if r.RemoteDurable {
			where = "  remote-durable"
		}
		fmt.Fprintf(a.stdout(), "%s  turn %d  %-4s  %s new  %s%s\n", r.ID.Short(), r.Turn, r.Class, bytesStr(r.BytesNew), durStr(api.Dur(r.DurationMS)), where)
		return nil
	})
	c.Flags().IntVar(&turn, "turn", 0, "turn number this checkpoint closes (default: parent's turn + 1)")
	c.Flags().StringVarP(&message, "message", "m", "", "a note stored with the checkpoint")
	c.Flags().BoolVar(&recordSkips, "record-skips", false, "write a record (class skip, no new bytes) for a turn that changed nothing")
	c.Flags().BoolVar(&waitRemote, "wait-remote", false, "return only once the checkpoint is stored in the remote bucket")
	return c
}

func (a *app) rollbackCmd() *cobra.Command {
	var fsOnly, abandon bool
	c := &cobra.Command{
		Use:   "rollback NAME CHECKPOINT [--fs-only] | rollback NAME --abandon",
		Short: "Make the sandbox's root (and processes) exactly that checkpoint and move its head there",
		Long: `Make the sandbox's root (and processes) exactly that checkpoint and move its
head there. A rollback that was killed midway is finished by the next command
that changes the sandbox; --abandon discards it instead: the root goes back
to the head (which the rollback had not moved), and the processes it stopped
stay stopped.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			req := api.RollbackRequest{FSOnly: fsOnly, Abandon: abandon}
			if len(args) == 2 {
				req.Checkpoint = args[1]
			}
			if abandon != (len(args) == 1) {
				return fmt.Errorf("rollback: give a CHECKPOINT, or --abandon alone: %w", errdefs.ErrInvalid)
			}
			r, err := s.Rollback(ctx, args[0], req)
			if err != nil {
				return err
			}
			if abandon {
				return a.printRestore("abandoned its interrupted rollback; back", r)
			}
			return a.printRestore("rolled back", r)
		}),
	}
	c.Flags().BoolVar(&fsOnly, "fs-only", false, "restore the checkpoint's files only, not its processes")
	c.Flags().BoolVar(&abandon, "abandon", false, "discard the sandbox's interrupted rollback instead of finishing it")
	return c
}

func (a *app) branchCmd() *cobra.Command {
	var backend, pool string
	var fsOnly, materialise, lazy bool
	var count int
	c := &cobra.Command{
		Use:   "branch CHECKPOINT NEWNAME [NEWNAME...] [--count N] [--backend overlay|btrfs [--btrfs-pool PATH]] [--lazy]",
		Short: "Create new sandboxes whose roots equal a checkpoint",
		Long: `Create one sandbox per NEWNAME whose root equals CHECKPOINT, with that
checkpoint as its head. With --count N and one NEWNAME, N sandboxes
NEWNAME-1 ... NEWNAME-N are made. Several at once check the checkpoint once
and are recorded together: all are made or none.

On overlay, a checkpoint this host keeps as a frozen layer (the newest 2 of
each sandbox by default, "frozen_keep" in HOME/config.json) is branched by
mounting that layer under an empty writable layer: no file is copied.
--materialise copies the layer from the store instead.

Without --backend it uses the backend and settings of the sandbox that took
the checkpoint, if that sandbox's root is on this home. A btrfs checkpoint
recorded by another home (a catalog rebuilt from a shared bucket, a fresh
home) never reuses the pool path recorded there: the branch uses this home's
btrfs pool if it has exactly one, and otherwise asks for --btrfs-pool DIR
(exit 2).

--lazy (one overlay sandbox) starts the sandbox before its files' bytes are
on this host, as after a catalog rebuild on a fresh home: each file is
fetched from the bucket on its first open, the rest in the background, and
a checkpoint or rollback of the sandbox waits until it is whole
(docs/STORAGE.md, "Lazy restore"). Without a daemon the command itself
waits for the whole restore before it exits.`,
		Args: cobra.MinimumNArgs(2),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			if pool != "" {
				abs, err := filepath.Abs(pool)
				if err != nil {
					return err
				}
				pool = abs
			}
			rs, err := s.Branch(ctx, args[0], api.BranchRequest{Name: args[1], Names: args[2:], Count: count,
				Materialise: materialise, Backend: backend, BtrfsPool: pool, FSOnly: fsOnly, Lazy: lazy})
			if err != nil {
				return err
			}
			if len(rs) > 1 || count > 0 {
				if a.json {
					return printJSON(a.stdout(), rs)
				}
				for i := range rs {
					if err := a.printRestore("branched", &rs[i]); err != nil {
						return err
					}
				}
				return nil
			}
			return a.printRestore("branched", &rs[0])
		}),
	}
	c.Flags().StringVar(&backend, "backend", "", "backend of the new sandbox (default: the one the checkpoint was taken on)")
	c.Flags().StringVar(&pool, "btrfs-pool", "", "btrfs backend: a directory on a mounted btrfs filesystem")
	c.Flags().BoolVar(&fsOnly, "fs-only", false, "restore the checkpoint's files only, not its processes")
	c.Flags().IntVar(&count, "count", 0, fmt.Sprintf("fan out: make N sandboxes NEWNAME-1 ... NEWNAME-N (at most %d; --json then prints a list)", api.MaxBranchCount))
	c.Flags().BoolVar(&materialise, "materialise", false, "copy the layer from the store instead of stacking on a frozen layer (kept, or built for the branch)")
	c.Flags().BoolVar(&lazy, "lazy", false, "start the sandbox before its files are fetched: each on first access, the rest in the background (overlay, one sandbox)")
	return c
}

func (a *app) printRestore(verb string, r *api.Restore) error {
	if a.json {
		return printJSON(a.stdout(), r)
	}
	procs := ""
	if r.Processes {
		procs = " with its processes"
	}
	fmt.Fprintf(a.stdout(), "sandbox %s %s to %s (turn %d)%s in %s; root %s\n", r.Sandbox, verb,
		r.Checkpoint.Short(), r.Turn, procs, durStr(api.Dur(r.DurationMS)), r.Root)
	if rc := r.Receipt; rc != nil {
		fmt.Fprintf(a.stdout(), "receipt: files %s match the checkpoint's (%s)", rc.Files.Got.Short(), rc.Files.Written)
		if rc.Processes != nil {
			fmt.Fprintf(a.stdout(), "; %d processes and %d listening sockets match the image's",
				len(rc.Processes.Got.Procs), len(rc.Processes.Got.Listening))
		}
		fmt.Fprintln(a.stdout())
	}
	return nil
}

func (a *app) verifyCmd() *cobra.Command {
	var storeOnly bool
	c := &cobra.Command{
		Use:   "verify CHECKPOINT | verify --store-only [CHECKPOINT]",
		Short: "Read every object a checkpoint needs and check every hash and every rule a restore checks",
		Long: `verify reads the checkpoint's record, every tree and chunk it needs and every
pack holding them, checks every hash and every rule a restore applies, and
re-hashes the base materialised on this host. --store-only does not use the
catalog: it locates blobs by reading every pack header in the store, checks
that every head and tag names a stored record, and verifies the checkpoint
given (or every checkpoint in the store).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if storeOnly {
				return cobra.MaximumNArgs(1)(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
	}
	c.RunE = a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
		if storeOnly {
			ref := ""
			if len(args) == 1 {
				ref = args[0]
			}
			r, err := s.VerifyStore(ctx, api.StoreVerifyRequest{Checkpoint: ref})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			fmt.Fprintf(a.stdout(), "store ok: %d packs, %d blobs, %d refs, %d checkpoints verified\n",
				r.Packs, r.Blobs, r.Refs, r.Checkpoints)
			return nil
		}
		r, err := s.Verify(ctx, args[0])
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), r)
		}
		fmt.Fprintf(a.stdout(), "checkpoint %s ok: %d objects, %d trees, %d chunks, %s verified; restores %d entries, %s\n",
			r.Checkpoint.Short(), len(r.Objects), r.Trees, r.Chunks, bytesStr(r.Bytes), r.Entries, bytesStr(int64(r.StateBytes)))
		if r.FrozenChecked {
			fmt.Fprintln(a.stdout(), "its frozen layer on this host (which its branches stack on) re-hashed ok")
		}
		return nil
	})
	c.Flags().BoolVar(&storeOnly, "store-only", false, "do not use the catalog: index blobs from pack headers (all checkpoints if none is named)")
	return c
}

func (a *app) catalogCmd() *cobra.Command {
	c := &cobra.Command{Use: "catalog", Short: "Maintain the catalog (an index of the store)"}
	var opts api.RebuildRequest
	rb := &cobra.Command{
		Use:   "rebuild [--strict]",
		Short: "Recreate the catalog from the object store alone",
		Long: `rebuild recreates the catalog from the object store alone (the local store
and the bucket). It restores what it can: every sandbox and checkpoint that
is whole comes back, and each object it cannot use is left out, with what
needs it, and named with its class:

  dangling         a head or tag names a checkpoint the store lacks (a prune
                   on another home deleted it)
  missing_objects  a record whose trees or chunks are in no pack, a ref to
                   such a record, a sandbox with no head
  corrupt          an object that does not decode or breaks a rule of the
                   format (a bad pack header, an over-limit size, a wrong
                   hash, a record or head that contradicts its sandbox)

A sandbox whose head is skipped is not restored, but its whole checkpoints
are: "log --all" lists them, and "branch" and "verify" take them.

Exit 0: complete. Exit 10: partial, the catalog was replaced and the skipped
objects are listed (one "skipped NAME (CLASS): why" line each, or --json's
"skipped", with "result": "partial"). Any other: failed, the old catalog stays. --strict fails at the
first object it would skip, naming it (exit 7). --skip-corrupt, the default
now, is still accepted.`,
		Args: cobra.NoArgs,
		RunE: a.withService(nil, func(ctx context.Context, s service, _ []string) error {
			r, err := s.RebuildCatalog(ctx, opts)
			if err != nil {
				return err
			}
			partial := len(r.Skipped) > 0
			if a.json {
				if err := printJSON(a.stdout(), r); err != nil {
					return err
				}
			} else {
				for _, c := range r.Skipped {
					fmt.Fprintf(a.stdout(), "skipped %s (%s): %s\n", c.Name, c.Class, c.Error)
				}
				tw := tabwriter.NewWriter(a.stdout(), 0, 4, 2, ' ', 0)
				what := "catalog rebuilt"
				if partial {
					what = "catalog rebuilt PARTIALLY"
				}
				fmt.Fprintf(tw, "%s in %s\npacks\t%d\nblobs\t%d\ncheckpoints\t%d\nsandboxes\t%d\nrefs\t%d\nskipped\t%d\n",
					what, durStr(time.Duration(r.DurationMS)*time.Millisecond), r.Packs, r.Blobs, r.Checkpoints, r.Sandboxes, r.Refs, len(r.Skipped))
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if partial {
				return commandExit{exitPartial}
			}
			return nil
		}),
	}
	rb.Flags().BoolVar(&opts.SkipCorrupt, "skip-corrupt", false, "accepted for compatibility: skipping what cannot be restored is the default")
	rb.Flags().BoolVar(&opts.Strict, "strict", false, "fail at the first object that would be skipped (the old catalog stays)")
	c.AddCommand(rb)
	return c
}
