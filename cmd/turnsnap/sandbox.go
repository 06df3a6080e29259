package main

import (
	"context"
	"fmt"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (a *app) sandboxCmd() *cobra.Command {
	c := &cobra.Command{Use: "sandbox", Short: "Create, list, locate, resume and remove sandboxes"}
	var base, backend, pool string
	create := &cobra.Command{
		Use:   "create NAME --base DIR [--backend btrfs --btrfs-pool PATH]",
		Short: "Create a sandbox whose root is an overlay on top of DIR, or a btrfs snapshot of it",
		Args:  cobra.ExactArgs(1),
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
			if backend == "" && pool != "" {
				backend = btrfs.Name
			}
			cfg, err := backendConfig(backend, pool)
			if err != nil {
				return err
			}
			r, err := e.CreateSandbox(ctx, args[0], engine.CreateOptions{Base: base, Backend: backend, Btrfs: cfg})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{
					"name": r.Sandbox.Name, "backend": r.Sandbox.Backend, "root": r.Root,
					"base_tree": r.Sandbox.BaseTree, "checkpoint": r.Checkpoint.ID,
					"files_base": r.BaseStats.Entries, "bytes_new": r.Checkpoint.Stats.BytesNew,
					"duration_ms": float64(r.Duration.Microseconds()) / 1000,
				})
			}
			fmt.Fprintf(a.stdout(), "sandbox %s created at %s\nbase %s: %d entries, %s read, %s new in store; checkpoint %s (turn 0) in %s\n",
				r.Sandbox.Name, r.Root, r.Sandbox.BaseTree.Short(), r.BaseStats.Entries, bytesStr(r.BaseStats.BytesRead),
				bytesStr(r.Checkpoint.Stats.BytesNew), r.Checkpoint.ID.Short(), durStr(r.Duration))
			return nil
		}),
	}
	create.Flags().StringVar(&base, "base", "", "directory to import as the sandbox's read-only base (required)")
	create.Flags().StringVar(&backend, "backend", "", "sandbox root backend: overlay (default) or btrfs")
	create.Flags().StringVar(&pool, "btrfs-pool", "", "btrfs backend: a directory on a mounted btrfs filesystem for the sandbox's subvolumes")
	create.MarkFlagRequired("base")

	path := &cobra.Command{
		Use:   "path NAME",
		Short: "Print the sandbox's mounted root (mounting it if needed)",
		Args:  cobra.ExactArgs(1),
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
			p, err := e.SandboxPath(ctx, args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]string{"name": args[0], "root": p})
			}
			fmt.Fprintln(a.stdout(), p)
			return nil
		}),
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "List sandboxes with their heads",
		Args:  cobra.NoArgs,
		RunE: a.readOnly(func(ctx context.Context, e *engine.Engine, _ []string) error {
			sbs, err := e.ListSandboxes(ctx)
			if err != nil {
				return err
			}
			return a.printSandboxes(sbs)
		}),
	}

	var catalogOnly bool
	rm := &cobra.Command{
		Use:   "rm NAME [--catalog-only]",
		Short: "Unmount and delete a sandbox's root (its checkpoints stay restorable)",
		Long: `rm stops the sandbox's processes, unmounts and deletes its root, and forgets
its head; its checkpoints stay restorable (branch them) until pruned.
--catalog-only forgets the sandbox without touching its root or processes:
for a sandbox whose root is on another host (seen here after a catalog
rebuild of a shared bucket). A btrfs sandbox recorded by another home whose
root is not here is always removed that way.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
			if err := e.RemoveSandboxWith(ctx, args[0], engine.RemoveOptions{CatalogOnly: catalogOnly}); err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{"name": args[0], "removed": true})
			}
			fmt.Fprintf(a.stdout(), "sandbox %s removed\n", args[0])
			return nil
		}),
	}
	rm.Flags().BoolVar(&catalogOnly, "catalog-only", false, "forget the sandbox without touching its root or processes (its root is on another host)")
	resume := &cobra.Command{
		Use:   "resume NAME",
		Short: "Thaw the sandbox's container if it is frozen (a turnsnap killed mid-checkpoint leaves it paused)",
		Long: `Thaw the sandbox's container if it is frozen. A checkpoint freezes the
container for its cut; a turnsnap killed meanwhile leaves it paused. The next
exec, checkpoint or rollback on the sandbox resumes such a container by itself
(and says so); resume is the operator's way to do it now, whoever froze it.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withEngine(func(ctx context.Context, e *engine.Engine, args []string) error {
			r, err := e.ResumeSandbox(ctx, args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{"name": r.Sandbox, "was_frozen": r.WasFrozen, "frozen_by": r.FrozenBy})
			}
			if !r.WasFrozen {
				fmt.Fprintf(a.stdout(), "sandbox %s: container was not frozen\n", r.Sandbox)
				return nil
			}
			fmt.Fprintf(a.stdout(), "sandbox %s: container resumed (it was frozen by %s)\n", r.Sandbox, r.FrozenBy)
			return nil
		}),
	}
	c.AddCommand(create, path, list, rm, resume)
	return c
}

func (a *app) printSandboxes(sbs []engine.SandboxInfo) error {
	w := a.stdout()
	if a.json {
		rows := []map[string]any{}
		for _, s := range sbs {
			row := map[string]any{"name": s.Sandbox.Name, "backend": s.Sandbox.Backend, "root": s.Root,
				"base_tree": s.Sandbox.BaseTree, "origin": s.Sandbox.Origin, "created": s.Sandbox.Created}
			if s.Head != nil {
				row["head"], row["turn"] = s.Head.ID, s.Head.Turn
			}
			rows = append(rows, row)
		}
		return printJSON(w, rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tBACKEND\tHEAD\tTURN\tROOT")
	for _, s := range sbs {
		head, turn := "-", "-"
		if s.Head != nil {
			head, turn = s.Head.ID.Short(), fmt.Sprint(s.Head.Turn)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Sandbox.Name, s.Sandbox.Backend, head, turn, s.Root)
	}
	return tw.Flush()
}

// backendConfig turns the backend flags into a sandbox's settings.
func backendConfig(backend, pool string) (btrfs.Options, error) {
	switch {
	case backend == btrfs.Name && pool == "":
		return btrfs.Options{}, fmt.Errorf("--backend btrfs needs --btrfs-pool PATH: %w", errdefs.ErrInvalid)
	case backend == btrfs.Name:
		abs, err := filepath.Abs(pool)
		if err != nil {
			return btrfs.Options{}, err
		}
		return btrfs.Options{Pool: abs}, nil
	case pool != "":
		return btrfs.Options{}, fmt.Errorf("--btrfs-pool is for --backend btrfs, not %q: %w", backend, errdefs.ErrInvalid)
	}
	return btrfs.Options{}, nil
}
