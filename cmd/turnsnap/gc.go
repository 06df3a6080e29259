package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine/retention"
)

func (a *app) gcCmd() *cobra.Command {
	var opts retention.GCOptions
	c := &cobra.Command{
		Use:   "gc [--grace DURATION] [--dry-run]",
		Short: "Delete packs no checkpoint references, locally and in the bucket",
		Long: `gc marks every blob reachable from any checkpoint record (in the bucket and on
this host) and deletes packs with no live blob that are older than --grace.
With a remote it holds the bucket's gc lock, so no host uploads meanwhile;
see docs/STORAGE.md for the protocol that keeps shared buckets safe.`,
		Args: cobra.NoArgs,
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, _ []string) error {
		grace := max(opts.Grace, 0).Milliseconds()
		r, err := s.GC(ctx, api.GCRequest{GraceMS: &grace, DryRun: opts.DryRun})
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), r)
		}
		verb := "deleted"
		if r.DryRun {
			verb = "would delete"
		}
		fmt.Fprintf(a.stdout(), "%d records, %d live blobs, %d packs: %s %d packs (%s); kept %d too young; %d packs partly live (%s dead inside)\n",
			r.Records, r.LiveBlobs, r.Packs, verb, r.Deleted, bytesStr(r.DeletedBytes), r.KeptYoung, r.PartlyLive, bytesStr(r.DeadBytesKept))
		if r.RecordsSwept > 0 {
			fmt.Fprintf(a.stdout(), "deleted first %d checkpoint records this home's prune or forget had marked\n", r.RecordsSwept)
		}
		return nil
	})
	c.Flags().DurationVar(&opts.Grace, "grace", retention.DefaultGCGrace, "never delete packs younger than this")
	c.Flags().BoolVar(&opts.DryRun, "dry-run", false, "report what would be deleted, delete nothing")
	return c
}

// graceHelp explains --grace of prune, forget and policy apply.
const graceHelp = `With a remote, what is kept is decided from every ref in the bucket as
well as this home's catalog: any home's heads, every tag, and the checkpoint
every sandbox description was branched from. And records are deleted in two
phases: this run marks them (the bucket's marks/ object), and a prune,
forget, policy apply or gc after --grace (default 1h) deletes those that no
ref in the bucket names then, re-reading every ref under the bucket's gc
lock first. So a branch another home makes meanwhile keeps its checkpoint.
--grace 0 deletes in this run, still after re-reading every ref. Marked
checkpoints are listed as "marked ..., deleted after DATE". Without a remote
records are deleted at once.`

func (a *app) pruneCmd() *cobra.Command {
	var opts retention.PruneOptions
	var gc bool
	c := &cobra.Command{
		Use:   "prune --keep-last N [--grace DURATION] [--gc]",
		Short: "Delete all but the newest N checkpoints of each sandbox (heads and tags are kept)",
		Long: `prune keeps, for each sandbox, its newest N checkpoints, its head, every
tagged checkpoint, and every checkpoint another sandbox continues from.
Every checkpoint names its whole state, so a kept checkpoint needs none of
its ancestors: pruning them only shortens the log. --dry-run lists the
checkpoints it would delete. --gc runs gc afterwards to reclaim the space.
For a finer policy (hourly, daily, within a span) see 'turnsnap forget'.

` + graceHelp,
		Args: cobra.NoArgs,
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, _ []string) error {
		grace := max(opts.Grace, 0).Milliseconds()
		r, err := s.Prune(ctx, api.PruneRequest{KeepLast: opts.KeepLast, DryRun: opts.DryRun, GC: gc, GraceMS: &grace})
		if err != nil {
			return err
		}
		g := r.GC
		if a.json {
			return printJSON(a.stdout(), r)
		}
		verb := "deleted"
		if opts.DryRun {
			verb = "would delete"
		}
		for _, d := range r.Checkpoints {
			fmt.Fprintf(a.stdout(), "%s %s  turn %-3d %s  [%s]\n", verb, d.ID.Short(), d.Turn,
				d.Created.Local().Format("2006-01-02 15:04:05"), d.Sandbox)
		}
		mverb := "marked"
		if opts.DryRun {
			mverb = "would mark"
		}
		for _, d := range r.Marked {
			fmt.Fprintf(a.stdout(), "%s %s  turn %-3d %s  [%s], deleted after %s\n", mverb, d.ID.Short(), d.Turn,
				d.Created.Local().Format("2006-01-02 15:04:05"), d.Sandbox, d.DeleteAfter.Local().Format("2006-01-02 15:04:05"))
		}
		fmt.Fprintf(a.stdout(), "kept %d checkpoints, %s %d", r.Kept, verb, len(r.Deleted))
		if len(r.Marked) > 0 {
			fmt.Fprintf(a.stdout(), ", %s %d for deletion", mverb, len(r.Marked))
		}
		fmt.Fprintln(a.stdout())
		if g != nil {
			fmt.Fprintf(a.stdout(), "gc: deleted %d packs (%s)\n", g.Deleted, bytesStr(g.DeletedBytes))
		}
		return nil
	})
	c.Flags().IntVar(&opts.KeepLast, "keep-last", 0, "checkpoints to keep per sandbox (required, >= 1)")
	c.Flags().DurationVar(&opts.Grace, "grace", retention.DefaultRecordGrace, "with a remote: keep pruned records marked this long before a later run deletes them (0: delete in this run)")
	c.Flags().BoolVar(&opts.DryRun, "dry-run", false, "report what would be deleted, delete nothing")
	c.Flags().BoolVar(&gc, "gc", false, "run gc afterwards")
	c.MarkFlagRequired("keep-last")
	return c
}
