package testhook

import "testing"

func TestSplitLast(t *testing.T) {
	for _, c := range []struct{ in, phase, arg string }{
		{"commit:/tmp/f", "commit", "/tmp/f"},
		{"rollback: layer-rewrite:/tmp/f", "rollback: layer-rewrite", "/tmp/f"},
		{"", "", ""}, {"commit:", "", ""}, {":/tmp/f", "", ""}, {"commit", "", ""},
	} {
		p, a, ok := splitLast(c.in)
		if p != c.phase || a != c.arg || ok != (c.phase != "") {
			t.Errorf("splitLast(%q) = %q, %q, %v", c.in, p, a, ok)
		}
	}
}

func TestChainSkipsNil(t *testing.T) {
	if Chain(nil, nil) != nil {
		t.Fatal("a chain of nothing must be nil, so the engine skips the call")
	}
	var got []string
	Chain(nil, func(p string) { got = append(got, "a"+p) }, func(p string) { got = append(got, "b"+p) })("x")
	if len(got) != 2 || got[0] != "ax" || got[1] != "bx" {
		t.Fatalf("chain called %v", got)
	}
}

// The shipped binary must not read the variables: without the tag, an armed
// variable yields no hook.
func TestHooksFollowTheTag(t *testing.T) {
	t.Setenv(BlockAtEnv, "commit:"+t.TempDir()+"/f")
	t.Setenv(HoldAtEnv, "commit:"+t.TempDir())
	if (BlockAt() != nil) != Enabled || (HoldAt() != nil) != Enabled {
		t.Fatalf("Enabled=%v but BlockAt/HoldAt armed=%v/%v", Enabled, BlockAt() != nil, HoldAt() != nil)
	}
}
