package delta

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestParseSandboxName(t *testing.T) {
	id := NewSandboxID()
	cases := []struct {
		in     string
		nameOK bool
	}{
		{"s", true},
		{"my-box_1.2", true},
		{id, true}, // an id is also a valid label
		{strings.Repeat("a", MaxNameLen), true},
		{strings.Repeat("a", MaxNameLen+1), false},
		{"", false},
		{".hidden", false},
		{"..", false},
		{"-flag", false},
		{"a/b", false},
		{"a@HEAD", false},
		{"a~1", false},
		{"a b", false},
		{"é", false},
	}
	for _, c := range cases {
		name, err := ParseSandboxName(c.in)
		if ok := err == nil; ok != c.nameOK {
			t.Errorf("ParseSandboxName(%q) = %v, want ok %v", c.in, err, c.nameOK)
		} else if ok && string(name) != c.in {
			t.Errorf("ParseSandboxName(%q) = %q", c.in, name)
		} else if !ok && (!errors.Is(err, errdefs.ErrInvalid) || strings.Count(err.Error(), c.in) != 1 && c.in != "") {
			t.Errorf("ParseSandboxName(%q): %v: want ErrInvalid naming it once", c.in, err)
		}
	}
}

func TestObjectNamesTakeKeys(t *testing.T) {
	id := NewSandboxID()
	sb := Sandbox{ID: id, Name: "s"}
	if got := SandboxObject(sb.Key()); got != SandboxPrefix+id {
		t.Errorf("SandboxObject = %q", got)
	}
	if got := HeadObject(sb.Key()); got != HeadPrefix+id || got != RefName(RefHead, id) {
		t.Errorf("HeadObject = %q", got)
	}
	legacy := Sandbox{Name: "old"}
	if legacy.Key() != "old" || HeadObject(legacy.Key()) != HeadPrefix+"old" {
		t.Errorf("legacy key %q", legacy.Key())
	}
	cp := Checkpoint{Sandbox: "s", SandboxID: id}
	if cp.SandboxKey() != SandboxKey(id) || (&Checkpoint{Sandbox: "old"}).SandboxKey() != "old" {
		t.Errorf("checkpoint key %q", cp.SandboxKey())
	}
}
