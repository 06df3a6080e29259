package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/turnsnap/turnsnap/btrfs"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A btrfs sandbox's description records its pool: a path on the host that
// made it. On another home (a catalog rebuilt from a shared bucket, or a
// fresh home on a reinstalled host) that path names nothing, or worse a
// different pool that happens to be mounted there. So the recorded pool is
// trusted only for a sandbox this home made whose root is here; anything
// else asks for a pool of this host.

// rootHere reports whether sb's root and pool are home's to use: its root
// directory exists on this home, or it is this home's (homeID) own sandbox.
func rootHere(h home, homeID string, sb *delta.Sandbox) bool {
	if sb.Backend != btrfs.Name {
		return true // overlay roots always live in this home
	}
	_, err := os.Stat(h.sandboxDir(sb.Name))
	return err == nil || (sb.Home != "" && sb.Home == homeID)
}

// errForeignRoot is the refusal to touch a root recorded by another home.
func errForeignRoot(sb *delta.Sandbox) error {
	var o btrfs.Options
	json.Unmarshal(sb.Config, &o)
	return fmt.Errorf("sandbox %s is a btrfs sandbox recorded by another home (pool %q there), and its root is not on this host; "+
		"branch its head here with --btrfs-pool DIR, or drop it from this catalog with `turnsnap sandbox rm %s --catalog-only`: %w",
		sb.Name, o.Pool, sb.Name, errdefs.ErrPrecondition)
}

// branchConfig picks the backend settings of a branch that named no
// backend: those of the sandbox that took the checkpoint, if that
// sandbox's root is here; for btrfs otherwise this host's pool, if this
// home uses exactly one. Where roots live is the engine's to know, not the
// remote side's: a catalog rebuilt from a shared bucket names roots of
// other hosts.
func branchConfig(ctx context.Context, cat *catalog.Catalog, h home, homeID string, cp *delta.Checkpoint) (json.RawMessage, error) {
	var src *delta.Sandbox
	pools := map[string]json.RawMessage{}
	err := cat.View(ctx, func(tx *catalog.Tx) error {
		sbs, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if sb.Key() == cp.SandboxKey() {
				src = sb
			}
			if sb.Backend == btrfs.Name && sb.Home == homeID && rootHere(h, homeID, sb) {
				var o btrfs.Options
				if json.Unmarshal(sb.Config, &o) == nil && o.Pool != "" {
					pools[o.Pool] = sb.Config
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if src != nil && src.Backend == cp.Backend && rootHere(h, homeID, src) {
		return src.Config, nil
	}
	if cp.Backend != btrfs.Name {
		return nil, nil
	}
	if len(pools) == 1 {
		for _, cfg := range pools {
			return cfg, nil
		}
	}
	return nil, fmt.Errorf("checkpoint %s was taken on btrfs in a sandbox whose pool is not this host's; "+
		"say where its root goes here with --btrfs-pool DIR (or --backend overlay): %w", cp.ID.Short(), errdefs.ErrInvalid)
}
