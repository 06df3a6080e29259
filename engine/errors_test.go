package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// TestErrorsNameSubjectOnce: the callee names its arguments and callers add
// only what they know, so a mistyped sandbox or checkpoint appears once in
// the message, not "sandbox agnet: sandbox agnet: not found".
func TestErrorsNameSubjectOnce(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "agent", CreateOptions{Base: richBase(t)})
	must(t, err)
	for _, tc := range []struct {
		what, subject string
		err           error
	}{
		{"checkpoint of a missing sandbox", "agnet", func() error { _, err := e.Checkpoint(ctx, "agnet", CheckpointOptions{}); return err }()},
		{"rollback of a missing sandbox", "agnet", func() error {
			_, err := e.Rollback(ctx, "agnet", mustRef(cr.Checkpoint.ID.String()), RollbackOptions{})
			return err
		}()},
		{"path of a missing sandbox", "agnet", func() error { _, err := e.SandboxPath(ctx, "agnet"); return err }()},
		{"log of a missing sandbox", "agnet", func() error { _, err := e.History().Log(ctx, "agnet"); return err }()},
		{"removal of a missing sandbox", "agnet", func() error { return e.RemoveSandbox(ctx, "agnet") }()},
		{"rollback to a missing checkpoint", `"123456789abc"`, func() error {
			_, err := e.Rollback(ctx, "agent", mustRef("123456789abc"), RollbackOptions{})
			return err
		}()},
		{"verify of a missing tag", `"nosuchtag"`, func() error { _, err := e.Verifier().Verify(ctx, mustRef("nosuchtag")); return err }()},
		{"forget of a missing sandbox", "agnet", func() error {
			_, err := e.Retention().Forget(ctx, retention.ForgetOptions{Sandbox: "agnet", Policy: retention.Policy{KeepLast: 1}})
			return err
		}()},
		{"policy of a missing sandbox", "agnet", e.Retention().SetPolicy(ctx, retention.PolicyOptions{Sandbox: "agnet", Policy: retention.Policy{KeepLast: 1}})},
		{"policies of a missing sandbox", "agnet", func() error { _, err := e.Retention().ShowPolicies(ctx, "agnet"); return err }()},
		{"processes of a missing sandbox", "agnet", func() error { _, err := e.Processes().List(ctx, "agnet", ProcessesOptions{}); return err }()},
	} {
		if !errors.Is(tc.err, errdefs.ErrNotFound) {
			t.Errorf("%s: got %v, want ErrNotFound", tc.what, tc.err)
			continue
		}
		if n := strings.Count(tc.err.Error(), tc.subject); n != 1 {
			t.Errorf("%s: %q names %s %d times, want once", tc.what, tc.err, tc.subject, n)
		}
	}
}
