package main

import (
	"context"
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/llmproxy"
)

func (a *app) sandboxCmd() *cobra.Command {
	c := &cobra.Command{Use: "sandbox", Short: "Create, list, locate, resume and remove sandboxes"}
	var base, backend, pool, llmUpstream string
	create := &cobra.Command{
		Use:   "create NAME --base DIR [--backend btrfs --btrfs-pool PATH]",
		Short: "Create a sandbox whose root is an overlay on top of DIR, or a btrfs snapshot of it",
		Args:  cobra.ExactArgs(1),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			// Paths are the caller's: a daemon resolves nothing against its
			// own working directory.
			absBase, err := filepath.Abs(base)
			if err != nil {
				return err
			}
			if pool != "" {
				if pool, err = filepath.Abs(pool); err != nil {
					return err
				}
			}
			if llmUpstream != "" {
				if err := llmproxy.CheckUpstream(llmUpstream); err != nil {
					return err
				}
			}
			r, err := s.CreateSandbox(ctx, api.CreateRequest{Name: args[0], Base: absBase, Backend: backend, BtrfsPool: pool})
			if err != nil {
				return err
			}
			if err := setLLMUpstream(ctx, s, args[0], llmUpstream); err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			fmt.Fprintf(a.stdout(), "sandbox %s created at %s\nbase %s: %d entries, %s read, %s new in store; checkpoint %s (turn 0) in %s\n",
				r.Name, r.Root, r.BaseTree.Short(), r.BaseFiles, bytesStr(r.BaseBytesRead),
				bytesStr(r.BytesNew), r.Checkpoint.Short(), durStr(time.Duration(r.DurationMS)*time.Millisecond))
			return nil
		}),
	}
	create.Flags().StringVar(&base, "base", "", "directory to import as the sandbox's read-only base (required)")
	create.Flags().StringVar(&backend, "backend", "", "sandbox root backend: overlay (default) or btrfs")
	create.Flags().StringVar(&pool, "btrfs-pool", "", "btrfs backend: a directory on a mounted btrfs filesystem for the sandbox's subvolumes")
	create.Flags().StringVar(&llmUpstream, "llm-upstream", "", "the sandbox's own model upstream for the daemon's LLM proxy (http(s) URL without credentials; default: serve --llm-upstream)")
	create.MarkFlagRequired("base")

	path := &cobra.Command{
		Use:   "path NAME",
		Short: "Print the sandbox's mounted root (mounting it if needed)",
		Args:  cobra.ExactArgs(1),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			p, err := s.SandboxPath(ctx, args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), p)
			}
			fmt.Fprintln(a.stdout(), p.Root)
			return nil
		}),
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "List sandboxes with their heads",
		Args:  cobra.NoArgs,
		RunE: a.withService(readOnly, func(ctx context.Context, s service, _ []string) error {
			sbs, err := s.ListSandboxes(ctx)
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
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			r, err := s.RemoveSandbox(ctx, args[0], catalogOnly)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
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
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			r, err := s.ResumeSandbox(ctx, args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			if !r.WasFrozen {
				fmt.Fprintf(a.stdout(), "sandbox %s: container was not frozen\n", r.Name)
				return nil
			}
			fmt.Fprintf(a.stdout(), "sandbox %s: container resumed (it was frozen by %s)\n", r.Name, r.FrozenBy)
			return nil
		}),
	}
	var force bool
	adopt := &cobra.Command{
		Use:   "adopt NAME [--force]",
		Short: "Take over another home's sandbox from the shared bucket (fences that home)",
		Long: `Exactly one home writes a sandbox's head in a shared bucket: the one that
created it, until another home adopts it. adopt makes this home the owner: it
rewrites the bucket's head with this home and the next epoch, on condition
that nobody moved it meanwhile, so the old owner's next push of that head is
refused (it is fenced, never merged). The sandbox continues here from the
bucket's head, its last remotely durable checkpoint; the old owner's turns
that it never pushed are not part of it (that home can branch them).
A sandbox whose owner's daemon renewed its host lease within its TTL is not
adopted without --force: its owner is alive and working. Run
'turnsnap catalog rebuild' first so this home knows the sandbox; to continue
another home's work without taking it over, branch it instead.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			r, err := s.AdoptSandbox(ctx, args[0], api.AdoptRequest{Force: force})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			if r.Already {
				fmt.Fprintf(a.stdout(), "sandbox %s: this home already owns it (epoch %d)\n", r.Name, r.Epoch)
				return nil
			}
			from := "home " + r.FromHome
			if r.FromHome == "" {
				from = "no owner"
			}
			fmt.Fprintf(a.stdout(), "sandbox %s adopted: owner epoch %d (was %s, epoch %d), continuing from %s\n",
				r.Name, r.Epoch, from, r.FromEpoch, r.Head[:12])
			return nil
		}),
	}
	adopt.Flags().BoolVar(&force, "force", false, "adopt even while the owner's host lease is live (fences a working owner)")
	c.AddCommand(create, path, list, rm, resume, adopt)
	return c
}

func (a *app) printSandboxes(sbs []api.Sandbox) error {
	w := a.stdout()
	if a.json {
		return printJSON(w, sbs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tBACKEND\tHEAD\tTURN\tROOT")
	for _, s := range sbs {
		head, turn := "-", "-"
		if s.Head != nil {
			head, turn = s.Head.Short(), fmt.Sprint(*s.Turn)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.Backend, head, turn, s.Root)
	}
	return tw.Flush()
}
