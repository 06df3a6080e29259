package receipt

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/statememo"
	"github.com/turnsnap/turnsnap/internal/rootfs"
)

// CRIU's restore touches the restored root: it binds each unix socket the
// processes had bound anew, which gives the socket node a new mtime, and it
// brings back each deleted-open ("ghost") file by creating it, opening it
// and unlinking it again, which moves its directory's mtime (and may copy
// a base directory up, leaving residue). None of that is the agent's work,
// but the first turn after a process restore would see it and be classed
// fs or full with nothing done.
//
// So right after a process restore the receipt scans the root and compares
// it with the checkpoint just restored (delta.Diff over base + layer, which
// already ignores directory mtimes and residue). If the only changes are
// socket nodes whose mtime alone moved (same type, mode, owner, xattrs),
// the scan's state key is accepted as the checkpoint's own for the next
// turn: it is recorded beside the checkpoint's id, and a turn whose scan
// has that key while the head is still that checkpoint is a skip. Anything
// else (a new, removed or rewritten file, a link_remap.N file CRIU leaves
// for a deleted file that still has another name, a socket whose mode
// changed) is not accepted, and the next turn records it as before: when
// unsure, checkpoint.
//
// The scan is committed to the root (Root.Committed: its scan cache, and
// on btrfs its scan state and a restore point) only when it is the
// checkpoint's state exactly. An accepted scan with socket noise names
// trees that were never stored (the directories holding the sockets): a
// root that took them as committed would hand them to the next turn's
// scan, which reuses an unchanged directory's tree by its ID, and that
// checkpoint would name a tree in no pack (btrfs did: the store-only
// verify of TestTurnAfterProcessRestoreIsTheAgents/btrfs found it). So
// the next fs turn scans those directories again, against the restored
// state, and stores what they hold; sockets have no content to read.
//
//	HOME/proc/NAME.restored   "<checkpoint id> <accepted state key>"

// The file's path is procs.Manager.RestoredFile: it goes with the
// processes (procs.Manager.Stop removes it).

// AcceptRestored runs after cp's processes were restored onto root.
// Failures only cost the next turn its skip, so they are logged.
func (c *Checker) AcceptRestored(ctx context.Context, name string, root rootfs.Root, cp *delta.Checkpoint) {
	os.Remove(c.d.Procs.RestoredFile(name))
	trees := statememo.NewTrees(c.d.Loader())
	res, err := root.Scan(ctx, trees)
	if err != nil {
		c.d.Log.Warn("scan after process restore", "sandbox", name, "err", err)
		return
	}
	if res.StateKey != cp.StateKey {
		ok, why, err := OnlyRestoreNoise(ctx, trees, cp, res.Root)
		if err != nil || !ok {
			c.d.Log.Info("the restore of processes changed files; the next turn records them", "sandbox", name, "change", why, "err", err)
			return
		}
		data := cp.ID.String() + " " + res.StateKey.String() + "\n"
		if err := os.WriteFile(c.d.Procs.RestoredFile(name), []byte(data), 0o600); err != nil {
			c.d.Log.Warn("record restored state", "sandbox", name, "err", err)
		}
		return // res names trees the store lacks: never the root's committed scan
	}
	if err := root.Committed(res); err != nil {
		c.d.Log.Warn("scan cache after process restore", "sandbox", name, "err", err)
	}
}

// RestoredAs reports whether key is the state key accepted for head right
// after its processes were restored.
func (c *Checker) RestoredAs(name string, head delta.ID, key delta.ID) bool {
	data, err := os.ReadFile(c.d.Procs.RestoredFile(name))
	if err != nil {
		return false
	}
	id, k, ok := strings.Cut(strings.TrimSpace(string(data)), " ")
	return ok && id == head.String() && k == key.String()
}

// OnlyRestoreNoise reports whether layer (on cp's base) differs from cp
// only in socket nodes' mtimes; why names the first other change.
func OnlyRestoreNoise(ctx context.Context, loader delta.BlobLoader, cp *delta.Checkpoint, layer delta.ID) (bool, string, error) {
	from, to := delta.Layers{cp.BaseTree, cp.FSTree}, delta.Layers{cp.BaseTree, layer}
	changes, err := delta.Diff(ctx, loader, from, to)
	if err != nil {
		return false, "", err
	}
	for _, c := range changes {
		why := fmt.Sprintf("%s %s (%s)", c.Kind, c.Path, c.Type)
		if c.Kind != delta.Modified || c.Type != delta.TypeSocket {
			return false, why, nil
		}
		a, okA, err := delta.Lookup(ctx, loader, from, c.Path)
		if err != nil {
			return false, why, err
		}
		b, okB, err := delta.Lookup(ctx, loader, to, c.Path)
		if err != nil {
			return false, why, err
		}
		if !okA || !okB || a.Type != delta.TypeSocket || b.Type != delta.TypeSocket || a.Mode != b.Mode ||
			a.UID != b.UID || a.GID != b.GID || !slices.EqualFunc(a.Xattrs, b.Xattrs, func(x, y delta.Xattr) bool {
			return x.Name == y.Name && string(x.Value) == string(y.Value)
		}) {
			return false, why, nil
		}
	}
	return true, "", nil
}
