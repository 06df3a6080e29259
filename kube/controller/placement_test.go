package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

func TestChoose(t *testing.T) {
	now := time.Unix(1000, 0)
	live, dead := now.Add(time.Second), now.Add(-time.Second)
	all := []node{
		{Name: "a", Home: "ha", Expires: live, Labels: map[string]string{"zone": "x"}},
		{Name: "b", Home: "hb", Expires: live, Labels: map[string]string{"zone": "y"}},
		{Name: "c", Home: "hc", Expires: dead},
		{Name: "d", Home: "", Expires: live}, // released on a clean shutdown
	}
	pick := func(want string, sel map[string]string, load map[string]int, capacity int, holds map[string]int, avoid string) string {
		n, why := choose(all, now, want, sel, load, capacity, holds, avoid)
		if n == nil {
			return "none: " + why
		}
		return n.Name
	}
	for _, c := range []struct {
		got, want string
	}{
		{pick("", nil, nil, 0, nil, ""), "a"},                                               // equal loads: by name
		{pick("", nil, map[string]int{"a": 2, "b": 1}, 0, nil, ""), "b"},                    // least loaded
		{pick("", nil, map[string]int{"a": 1, "b": 1}, 0, map[string]int{"b": 2}, ""), "b"}, // holder wins a tie
		{pick("", nil, map[string]int{"a": 1}, 0, map[string]int{"a": 2}, ""), "b"},         // but not over load
		{pick("", nil, map[string]int{"a": 1, "b": 1}, 1, nil, ""), "none"},                 // full
		{pick("", map[string]string{"zone": "y"}, nil, 0, nil, ""), "b"},                    // selector
		{pick("c", nil, nil, 0, nil, ""), "none"},                                           // want, dead
		{pick("d", nil, nil, 0, nil, ""), "none"},                                           // want, released
		{pick("b", nil, map[string]int{"b": 9}, 0, nil, ""), "b"},                           // want, however loaded
		{pick("", nil, nil, 0, nil, "a"), "b"},                                              // avoid the dead node
	} {
		if c.got != c.want && !(c.want == "none" && strings.HasPrefix(c.got, "none")) {
			t.Errorf("chose %q, want %q", c.got, c.want)
		}
	}
}

func TestSandboxNameIsValidAndUnique(t *testing.T) {
	long := strings.Repeat("n", 63)
	seen := map[string]bool{}
	for _, c := range [][2]string{{"work", "agent"}, {long, long}, {long, long[:62] + "m"}, {"a", "b.c"}} { // namespaces have no dots
		got := sandboxName(c[0], c[1])
		if _, err := delta.ParseSandboxName(got); err != nil {
			t.Errorf("sandboxName(%q, %q) = %q: %v", c[0], c[1], got, err)
		}
		if seen[got] {
			t.Errorf("sandboxName(%q, %q) = %q twice", c[0], c[1], got)
		}
		seen[got] = true
	}
	if sandboxName("work", "agent") != "work.agent" {
		t.Errorf("short names stay readable: %q", sandboxName("work", "agent"))
	}
}
