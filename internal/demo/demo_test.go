package demo

import (
	"context"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The demo is the README's first command; it must keep working and keep
// showing what it claims.
func TestDemo(t *testing.T) {
	testenv.RequireRoot(t)
	if !processesAvailable() {
		testenv.Missing(t, "runc, CRIU and busybox", "the demo's dev-server turn needs them")
	}
	var out strings.Builder
	rep, err := Run(context.Background(), Options{Dir: t.TempDir(), Out: &out})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	want := map[int]delta.Class{0: delta.ClassFS, 1: delta.ClassFS, 2: delta.ClassSkip, 3: delta.ClassSkip,
		4: delta.ClassProcess, 5: delta.ClassFS}
	for _, turn := range rep.Turns {
		if c, ok := want[turn.Turn]; ok && turn.Sandbox == "agent" && turn.Class != c {
			t.Errorf("turn %d (%s) classed %s, want %s", turn.Turn, turn.Action, turn.Class, c)
		}
		if turn.Class == delta.ClassSkip && turn.BytesNew != 0 {
			t.Errorf("skip turn %d wrote %d bytes", turn.Turn, turn.BytesNew)
		}
	}
	if rep.Verified < 8 || rep.DiffChanges == 0 {
		t.Errorf("verified %d checkpoints, diff %d changes", rep.Verified, rep.DiffChanges)
	}
	if rep.ServerAnswers != "dev server: all tests green" {
		t.Errorf("dev server after rollback answered %q", rep.ServerAnswers)
	}
	for _, s := range []string{"rollback agent -> turn 6", "verify:", "skip", "CRIU image"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("demo output lacks %q:\n%s", s, out.String())
		}
	}
}
