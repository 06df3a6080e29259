package main

import (
	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/internal/demo"
)

func (a *app) demoCmd() *cobra.Command {
	var keep bool
	var dir string
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run a scripted agent session in a temporary home and print what each turn cost",
		Long: `demo creates a temporary turnsnap home and a small project as the base, runs a
scripted multi-turn agent session in an overlay sandbox (edits, a no-op turn,
a temp file, deleting a base file, installing dependencies, a failed
destructive edit), checkpoints every turn, rolls the failed edit back,
branches, verifies every checkpoint, and prints a per-turn table. Needs root
(overlay mounts). --home is not used: the demo never touches a real home.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := demo.Options{Dir: dir, Keep: keep, Out: a.stdout()}
			if a.json {
				opts.Out = nil
			}
			rep, err := demo.Run(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), rep)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&keep, "keep", false, "keep the demo's home and sandboxes for inspection")
	c.Flags().StringVar(&dir, "dir", "", "directory for the demo's home and base (default: a new temporary directory)")
	return c
}
