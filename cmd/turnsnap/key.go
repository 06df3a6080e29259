package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/keys"
)

func (a *app) keyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "key",
		Short: "Master keys of encrypted stores: generate, rotate",
	}
	gen := &cobra.Command{
		Use:   "generate PATH",
		Short: "Write a new master key to PATH (mode 0600; never overwrites)",
		Long: `generate writes a new random 256-bit master key to PATH. Keep it off the
host's store and off the bucket: whoever holds it reads every checkpoint of
the store it opens, and without it nothing of that store can be read.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := keys.GenerateKeyFile(args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), map[string]any{"key_file": args[0], "key_id": id})
			}
			fmt.Fprintf(a.stdout(), "key %s written to %s\n", id, args[0])
			return nil
		},
	}
	var newKey string
	rot := &cobra.Command{
		Use:   "rotate --new-key-file PATH",
		Short: "Make another master key the one that opens this home's store",
		Long: `rotate wraps the store's data key again under PATH's master key (remote
store first, then local), switches the home to it and deletes the old
wrapping. No checkpoint is rewritten: it costs a few small writes. Other
hosts of the same bucket then need the new key file.`,
		Args: cobra.NoArgs,
	}
	rot.RunE = a.withEngine(func(ctx context.Context, e *engine.Engine, _ []string) error {
		r, err := e.Keys().Rotate(ctx, newKey)
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), map[string]any{"old_key_id": r.OldKey, "key_id": r.NewKey})
		}
		fmt.Fprintf(a.stdout(), "store key rotated: %s -> %s\n", r.OldKey, r.NewKey)
		return nil
	})
	rot.Flags().StringVar(&newKey, "new-key-file", "", "the new master key file (required)")
	rot.MarkFlagRequired("new-key-file")
	c.AddCommand(gen, rot)
	return c
}
