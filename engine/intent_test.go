package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// An intent of the older, name-keyed form (HOME/intents/rollback-NAME,
// before issue 24) is finished for a sandbox that existed when it was
// written, and dropped for one created after it: that one belonged to a
// removed sandbox of the same name.
func TestLegacyNameKeyedIntent(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		age     time.Duration // written this long before the sandbox was created (<0: after)
		applies bool
	}{
		{"written after the sandbox was created", -time.Minute, true},
		{"written before the sandbox was created", time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := openEngine(t, filepath.Join(t.TempDir(), "home"))
			cr, c1 := firstTurn(t, e)
			write(t, filepath.Join(cr.Root, "two.txt"), "turn 2\n")
			c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
			must(t, err)
			p := filepath.Join(e.home.intentsDir(), "rollback-s") // the legacy, name-keyed form
			must(t, os.MkdirAll(filepath.Dir(p), 0o700))
			write(t, p, c1.ID.String()+"\n")
			at := cr.Sandbox.Created.Add(-tc.age)
			must(t, os.Chtimes(p, at, at))

			_, err = e.SandboxPath(ctx, "s") // the next use of the sandbox
			must(t, err)
			var head delta.ID
			must(t, e.view(ctx, func(tx *catalog.Tx) (err error) { head, err = tx.GetRef(delta.RefHead, "s"); return err }))
			want := c2.ID
			if tc.applies {
				want = c1.ID
			}
			if head != want {
				t.Fatalf("head %s after the load, want %s (c1 %s, c2 %s)", head.Short(), want.Short(), c1.ID.Short(), c2.ID.Short())
			}
			if _, err := os.Stat(filepath.Join(cr.Root, "two.txt")); os.IsNotExist(err) != tc.applies {
				t.Fatalf("two.txt after the load: %v", err)
			}
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Fatalf("the legacy intent is still there: %v", err)
			}
		})
	}
}
