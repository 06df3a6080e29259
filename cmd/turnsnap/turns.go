package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

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
	c.RunE = a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
		opts := engine.CheckpointOptions{Message: message, RecordSkips: recordSkips}
		if c.Flags().Changed("turn") {
			opts.Turn = &turn
		}
		r, err := e.Checkpoint(ctx, args[0], opts)
		if err != nil {
			return err
		}
		remote := false
		if waitRemote {
			// Only what this checkpoint needs goes first, in the urgent lane.
			if _, err := e.Push(ctx, engine.PushOptions{Sandbox: args[0], Urgent: true}); err != nil {
				return fmt.Errorf("checkpoint %s is durable locally, not yet remotely: %w", r.ID.Short(), err)
			}
			remote = true
		}
		if a.json {
			return printJSON(a.stdout(), map[string]any{
				"remote_durable": remote, "process_change": r.ProcessChange,
				"id": r.ID, "sandbox": r.Sandbox, "class": r.Class, "turn": r.Turn, "parent": r.Parent,
				"bytes_new": r.Stats.BytesNew, "objects_new": r.Stats.ObjectsNew, "blobs_new": r.Stats.BlobsNew,
				"files_read": r.Stats.FilesRead, "bytes_read": r.Stats.BytesRead, "entries": r.Stats.Entries,
				"duration_ms": float64(r.Duration.Microseconds()) / 1000,
			})
		}
		where := ""
		if remote {
			where = "  remote-durable"
		}
		fmt.Fprintf(a.stdout(), "%s  turn %d  %-4s  %s new  %s%s\n", r.ID.Short(), r.Turn, r.Class, bytesStr(r.Stats.BytesNew), durStr(r.Duration), where)
		return nil
	})
	c.Flags().IntVar(&turn, "turn", 0, "turn number this checkpoint closes (default: parent's turn + 1)")
	c.Flags().StringVarP(&message, "message", "m", "", "a note stored with the checkpoint")
	c.Flags().BoolVar(&recordSkips, "record-skips", false, "write a record (class skip, no new bytes) for a turn that changed nothing")
	c.Flags().BoolVar(&waitRemote, "wait-remote", false, "return only once the checkpoint is stored in the remote bucket")
	return c
}

func (a *app) rollbackCmd() *cobra.Command {
	var fsOnly bool
	c := &cobra.Command{
		Use:   "rollback NAME CHECKPOINT [--fs-only]",
		Short: "Make the sandbox's root (and processes) exactly that checkpoint and move its head there",
		Args:  cobra.ExactArgs(2),
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
			r, err := e.Rollback(ctx, args[0], args[1], engine.RollbackOptions{FSOnly: fsOnly})
			if err != nil {
				return err
			}
			return a.printRestore("rolled back", r)
		}),
	}
	c.Flags().BoolVar(&fsOnly, "fs-only", false, "restore the checkpoint's files only, not its processes")
	return c
}

func (a *app) branchCmd() *cobra.Command {
	var backend, pool string
	var fsOnly, materialise bool
	var count int
	c := &cobra.Command{
		Use:   "branch CHECKPOINT NEWNAME [NEWNAME...] [--count N] [--backend overlay|btrfs [--btrfs-pool PATH]]",
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
(exit 2).`,
		Args: cobra.MinimumNArgs(2),
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
			if backend == "" && pool != "" {
				backend = btrfs.Name
			}
			cfg, err := backendConfig(backend, pool)
			if err != nil {
				return err
			}
			o := engine.BranchOptions{Backend: backend, Btrfs: cfg, FSOnly: fsOnly, Materialise: materialise}
			names := args[1:]
			if count != 0 {
				if len(names) != 1 {
					return fmt.Errorf("--count takes one NEWNAME prefix, got %d names: %w", len(names), errdefs.ErrInvalid)
				}
				if names, err = engine.BranchNames(names[0], count); err != nil {
					return err
				}
			}
			if len(names) == 1 && count == 0 {
				r, err := e.Branch(ctx, args[0], names[0], o)
				if err != nil {
					return err
				}
				return a.printRestore("branched", r)
			}
			rs, err := e.BranchMany(ctx, args[0], names, o)
			if err != nil {
				return err
			}
			if a.json {
				out := make([]map[string]any, len(rs))
				for i, r := range rs {
					out[i] = restoreJSON(r)
				}
				return printJSON(a.stdout(), out)
			}
			for _, r := range rs {
				if err := a.printRestore("branched", r); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	c.Flags().StringVar(&backend, "backend", "", "backend of the new sandbox (default: the one the checkpoint was taken on)")
	c.Flags().StringVar(&pool, "btrfs-pool", "", "btrfs backend: a directory on a mounted btrfs filesystem")
	c.Flags().BoolVar(&fsOnly, "fs-only", false, "restore the checkpoint's files only, not its processes")
	c.Flags().IntVar(&count, "count", 0, "make N branches NEWNAME-1 ... NEWNAME-N")
	c.Flags().BoolVar(&materialise, "materialise", false, "copy the layer from the store even if a frozen layer is kept")
	return c
}

func restoreJSON(r *engine.RestoreResult) map[string]any {
	return map[string]any{"sandbox": r.Sandbox, "checkpoint": r.Checkpoint.ID,
		"turn": r.Checkpoint.Turn, "root": r.Root, "processes": r.Processes,
		"duration_ms": float64(r.Duration.Microseconds()) / 1000}
}

func (a *app) printRestore(verb string, r *engine.RestoreResult) error {
	if a.json {
		return printJSON(a.stdout(), restoreJSON(r))
	}
	procs := ""
	if r.Processes {
		procs = " with its processes"
	}
	fmt.Fprintf(a.stdout(), "sandbox %s %s to %s (turn %d)%s in %s; root %s\n", r.Sandbox, verb,
		r.Checkpoint.ID.Short(), r.Checkpoint.Turn, procs, durStr(r.Duration), r.Root)
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
	c.RunE = a.readOnly(func(ctx context.Context, e *engine.Engine, args []string) error {
		if storeOnly {
			ref := ""
			if len(args) == 1 {
				ref = args[0]
			}
			r, err := e.VerifyStore(ctx, ref)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{"ok": true, "packs": r.Packs, "blobs": r.Blobs,
					"refs": r.Refs, "checkpoints": len(r.Checkpoints)})
			}
			fmt.Fprintf(a.stdout(), "store ok: %d packs, %d blobs, %d refs, %d checkpoints verified\n",
				r.Packs, r.Blobs, r.Refs, len(r.Checkpoints))
			return nil
		}
		r, err := e.Verify(ctx, args[0])
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), map[string]any{"checkpoint": r.Checkpoint, "ok": true,
				"objects": r.Objects, "trees": r.Trees, "chunks": r.Chunks, "bytes": r.Bytes,
				"entries": r.Entries, "bytes_expanded": r.StateBytes, "base_checked": r.BaseChecked})
		}
		fmt.Fprintf(a.stdout(), "checkpoint %s ok: %d objects, %d trees, %d chunks, %s verified; restores %d entries, %s\n",
			r.Checkpoint.Short(), len(r.Objects), r.Trees, r.Chunks, bytesStr(r.Bytes), r.Entries, bytesStr(int64(r.StateBytes)))
		return nil
	})
	c.Flags().BoolVar(&storeOnly, "store-only", false, "do not use the catalog: index blobs from pack headers (all checkpoints if none is named)")
	return c
}

func (a *app) catalogCmd() *cobra.Command {
	c := &cobra.Command{Use: "catalog", Short: "Maintain the catalog (an index of the store)"}
	var opts engine.RebuildOptions
	rb := &cobra.Command{
		Use:   "rebuild [--skip-corrupt]",
		Short: "Recreate the catalog from the object store alone",
		Long: `rebuild recreates the catalog from the object store alone (the local store
and the bucket). A damaged object fails the rebuild, naming it (exit 7), and
the old catalog stays; with --skip-corrupt each damaged object is reported
and the rebuild goes on from the rest.`,
		Args: cobra.NoArgs,
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, _ []string) error {
			r, err := e.RebuildCatalogWith(ctx, opts)
			if err != nil {
				return err
			}
			if a.json {
				corrupt := r.Corrupt
				if corrupt == nil {
					corrupt = []engine.CorruptObject{}
				}
				return printJSON(a.stdout(), map[string]any{"packs": r.Packs, "blobs": r.Blobs, "checkpoints": r.Checkpoints,
					"sandboxes": r.Sandboxes, "refs": r.Refs, "duration_ms": float64(r.Duration.Microseconds()) / 1000, "corrupt": corrupt})
			}
			for _, c := range r.Corrupt {
				fmt.Fprintf(os.Stderr, "skipped damaged object %s: %s\n", c.Name, c.Error)
			}
			tw := tabwriter.NewWriter(a.stdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "catalog rebuilt in %s\npacks\t%d\nblobs\t%d\ncheckpoints\t%d\nsandboxes\t%d\nrefs\t%d\nskipped (damaged)\t%d\n",
				durStr(r.Duration), r.Packs, r.Blobs, r.Checkpoints, r.Sandboxes, r.Refs, len(r.Corrupt))
			return tw.Flush()
		}),
	}
	rb.Flags().BoolVar(&opts.SkipCorrupt, "skip-corrupt", false, "report each damaged object and rebuild from the rest")
	c.AddCommand(rb)
	return c
}
