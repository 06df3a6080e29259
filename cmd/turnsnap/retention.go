package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine/retention"
)

// policyFlags binds the --keep-* flags shared by forget and policy set.
func policyFlags(c *cobra.Command, p *api.RetentionPolicy) {
	f := c.Flags()
	f.IntVar(&p.KeepLast, "keep-last", 0, "keep the newest N checkpoints")
	f.StringVar(&p.KeepWithin, "keep-within", "", "keep checkpoints taken within this span before the newest one (36h, 7d, 2w)")
	f.IntVar(&p.KeepHourly, "keep-hourly", 0, "keep the newest checkpoint of each of the last N hours that have one (UTC)")
	f.IntVar(&p.KeepDaily, "keep-daily", 0, "keep the newest checkpoint of each of the last N days that have one (UTC)")
	f.IntVar(&p.KeepWeekly, "keep-weekly", 0, "keep the newest checkpoint of each of the last N ISO weeks that have one")
	f.IntVar(&p.KeepMonthly, "keep-monthly", 0, "keep the newest checkpoint of each of the last N months that have one")
	f.StringArrayVar(&p.KeepTags, "keep-tag", nil, "keep checkpoints with a tag matching this pattern (repeatable; release-*)")
}

const retentionRules = `A checkpoint is kept when any rule keeps it (restic's forget policy):
  --keep-last N      the newest N
  --keep-within D    every checkpoint taken within D before the sandbox's newest
                     one (relative to the newest, not to now; 36h, 7d, 2w)
  --keep-hourly N, --keep-daily N, --keep-weekly N, --keep-monthly N
                     the newest checkpoint of each of the last N hours, days,
                     ISO weeks, months (UTC) that have one
  --keep-tag T       checkpoints with a tag matching T (a pattern: release-*)
Whatever the policy, these always stay: every head, every tagged checkpoint,
and every checkpoint another sandbox continues from (branched from it,
rolled back to it, or took a checkpoint on top of it). Only checkpoints of
sandboxes this home created are deleted.`

func (a *app) forgetCmd() *cobra.Command {
	var opts api.ForgetOptions
	var gc bool
	var grace time.Duration
	c := &cobra.Command{
		Use:   "forget NAME|--all --keep-... [--dry-run] [--grace DURATION] [--gc]",
		Short: "Delete the checkpoints a retention policy does not keep",
		Long: `forget applies a retention policy to one sandbox (or every sandbox with
--all) and deletes the checkpoints it does not keep. --dry-run lists what
would be kept and deleted, and why. --gc runs gc afterwards to reclaim the
space.

` + retentionRules + "\n\n" + graceHelp,
		Args: func(cmd *cobra.Command, args []string) error {
			if opts.All {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, args []string) error {
		if len(args) == 1 {
			opts.Sandbox = args[0]
		}
		ms := max(grace, 0).Milliseconds()
		r, err := s.Forget(ctx, api.ForgetRequest{ForgetOptions: opts, GC: gc, GraceMS: &ms})
		if err != nil {
			return err
		}
		return a.printForget(r)
	})
	policyFlags(c, &opts.Policy)
	c.Flags().BoolVar(&opts.All, "all", false, "every sandbox this home created")
	c.Flags().BoolVar(&opts.DryRun, "dry-run", false, "list what would be kept and deleted, delete nothing")
	c.Flags().BoolVar(&gc, "gc", false, "run gc afterwards")
	c.Flags().DurationVar(&grace, "grace", retention.DefaultRecordGrace, "with a remote: keep dropped records marked this long before a later run deletes them (0: delete in this run)")
	return c
}

func (a *app) printForget(r *api.Forgotten) error {
	if a.json {
		return printJSON(a.stdout(), r)
	}
	g := r.GC
	w := a.stdout()
	verb, mverb := "deleted", "marked"
	if r.DryRun {
		verb, mverb = "would delete", "would mark"
	}
	for _, s := range r.Sandboxes {
		fmt.Fprintf(w, "sandbox %s: keep %d, %s %d", s.Sandbox, len(s.Kept), verb, len(s.Deleted))
		if len(s.Marked) > 0 {
			fmt.Fprintf(w, ", %s %d for deletion", mverb, len(s.Marked))
		}
		fmt.Fprintln(w)
		for _, k := range s.Kept {
			fmt.Fprintf(w, "  keep    %s  turn %-3d %s  %s\n", k.ID.Short(), k.Turn, k.Created.Local().Format("2006-01-02 15:04:05"), strings.Join(k.Reasons, ", "))
		}
		for _, d := range s.Deleted {
			fmt.Fprintf(w, "  delete  %s  turn %-3d %s\n", d.ID.Short(), d.Turn, d.Created.Local().Format("2006-01-02 15:04:05"))
		}
		for _, d := range s.Marked {
			fmt.Fprintf(w, "  %s  %s  turn %-3d %s  deleted after %s\n", mverb, d.ID.Short(), d.Turn,
				d.Created.Local().Format("2006-01-02 15:04:05"), d.DeleteAfter.Local().Format("2006-01-02 15:04:05"))
		}
	}
	for _, d := range r.Swept {
		fmt.Fprintf(w, "deleted %s  turn %-3d %s  [%s] (marked by an earlier run)\n", d.ID.Short(), d.Turn,
			d.Created.Local().Format("2006-01-02 15:04:05"), d.Sandbox)
	}
	fmt.Fprintf(w, "kept %d checkpoints, %s %d", r.CheckpointsKept, verb, r.CheckpointsDeleted)
	if r.CheckpointsMarked > 0 {
		fmt.Fprintf(w, ", %s %d for deletion", mverb, r.CheckpointsMarked)
	}
	fmt.Fprintln(w)
	if g != nil {
		fmt.Fprintf(w, "gc: deleted %d packs (%s)\n", g.Deleted, bytesStr(g.DeletedBytes))
	}
	return nil
}

func (a *app) policyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "policy set|show|clear [NAME] | policy apply",
		Short: "Store the retention policy of a sandbox or of the home",
		Long: `policy stores a retention policy in the home (HOME/retention.json): the
home's (without NAME) or one sandbox's, which replaces the home's for that
sandbox. The daemon applies the stored policies on its schedule, as
'forget' would with the same flags; 'policy apply' does it now (from cron,
for a host without the daemon).

` + retentionRules,
	}
	var p api.RetentionPolicy
	set := &cobra.Command{
		Use:   "set [NAME] --keep-...",
		Short: "Set the policy of a sandbox (or of the home, without NAME)",
		Args:  cobra.MaximumNArgs(1),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			opts := api.PolicyOptions{Policy: p}
			if len(args) == 1 {
				opts.Sandbox = args[0]
			}
			v, err := s.SetPolicy(ctx, opts)
			if err != nil {
				return err
			}
			return a.showPolicies(v, opts.Sandbox)
		}),
	}
	policyFlags(set, &p)
	show := &cobra.Command{
		Use:   "show [NAME]",
		Short: "Show the home's policy and the one each sandbox follows",
		Args:  cobra.MaximumNArgs(1),
		RunE: a.withService(readOnly, func(ctx context.Context, s service, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			v, err := s.ShowPolicies(ctx, name)
			if err != nil {
				return err
			}
			return a.showPolicies(v, name)
		}),
	}
	clear := &cobra.Command{
		Use:   "clear [NAME]",
		Short: "Remove the policy of a sandbox (it then follows the home's) or of the home",
		Args:  cobra.MaximumNArgs(1),
		RunE: a.withService(nil, func(ctx context.Context, s service, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			v, err := s.ClearPolicy(ctx, name)
			if err != nil {
				return err
			}
			return a.showPolicies(v, name)
		}),
	}
	apply := &cobra.Command{
		Use:   "apply [--gc]",
		Short: "Carry out the stored policies now (what the daemon does on its schedule)",
		Args:  cobra.NoArgs,
	}
	var gc bool
	var grace time.Duration
	apply.RunE = a.withService(nil, func(ctx context.Context, s service, _ []string) error {
		ms := max(grace, 0).Milliseconds()
		r, err := s.ApplyPolicies(ctx, api.ApplyPoliciesRequest{GC: gc, GraceMS: &ms})
		if err != nil {
			return err
		}
		return a.printForget(r)
	})
	apply.Flags().BoolVar(&gc, "gc", false, "run gc afterwards")
	apply.Flags().DurationVar(&grace, "grace", retention.DefaultRecordGrace, "with a remote: keep dropped records marked this long before a later run deletes them (0: delete in this run)")
	c.AddCommand(set, show, clear, apply)
	return c
}

func (a *app) showPolicies(v *api.PolicyView, name string) error {
	if a.json {
		return printJSON(a.stdout(), v)
	}
	w := a.stdout()
	if name == "" {
		fmt.Fprintf(w, "home: %s\n", policyText(v.Home))
	}
	for _, s := range v.Sandboxes {
		fmt.Fprintf(w, "%s: %s", s.Sandbox, policyText(s.Policy))
		if s.Source == "home" {
			fmt.Fprint(w, " (the home's)")
		}
		fmt.Fprintln(w)
	}
	return nil
}

func policyText(p *api.RetentionPolicy) string {
	if p == nil || p.IsZero() {
		return "none"
	}
	var b strings.Builder
	add := func(flag string, n int) {
		if n > 0 {
			fmt.Fprintf(&b, " --%s %d", flag, n)
		}
	}
	add("keep-last", p.KeepLast)
	if p.KeepWithin != "" {
		fmt.Fprintf(&b, " --keep-within %s", p.KeepWithin)
	}
	add("keep-hourly", p.KeepHourly)
	add("keep-daily", p.KeepDaily)
	add("keep-weekly", p.KeepWeekly)
	add("keep-monthly", p.KeepMonthly)
	for _, t := range p.KeepTags {
		fmt.Fprintf(&b, " --keep-tag %s", t)
	}
	return strings.TrimSpace(b.String())
}
