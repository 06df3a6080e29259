package rootfs

import (
	"context"
	"slices"
	"testing"
)

// Phase reaches the function WithPhase installed, in order, and is a no-op
// on a context without one (every production restore).
func TestPhase(t *testing.T) {
	Phase(context.Background(), "no listener") // must not panic
	var got []string
	ctx := WithPhase(context.Background(), func(name string) { got = append(got, name) })
	Phase(ctx, "extract")
	derived, cancel := context.WithCancel(ctx)
	defer cancel()
	Phase(derived, "swap") // survives derived contexts
	if want := []string{"extract", "swap"}; !slices.Equal(got, want) {
		t.Fatalf("phases %q, want %q", got, want)
	}
	Phase(WithPhase(ctx, nil), "ignored")
	if len(got) != 2 {
		t.Fatalf("a nil phase function was called around: %q", got)
	}
}
