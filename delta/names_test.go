package delta

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestParseSandboxNameAndKey(t *testing.T) {
	id := NewSandboxID()
	cases := []struct {
		in     string
		nameOK bool
		keyOK  bool
	}{
		{"s", true, true},
		{"my-box_1.2", true, true},
		{id, true, true}, // an id is also a valid label
		{strings.Repeat("a", MaxNameLen), true, true},
		{strings.Repeat("a", MaxNameLen+1), false, false},
		{"", false, false},
		{".hidden", false, false},
		{"..", false, false},
		{"-flag", false, false},
		{"a/b", false, false},
		{"a@HEAD", false, false},
		{"a~1", false, false},
		{"a b", false, false},
		{"é", false, false},
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
		key, err := ParseSandboxKey(c.in)
		if ok := err == nil; ok != c.keyOK {
			t.Errorf("ParseSandboxKey(%q) = %v, want ok %v", c.in, err, c.keyOK)
		} else if ok && string(key) != c.in {
			t.Errorf("ParseSandboxKey(%q) = %q", c.in, key)
		} else if !ok && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseSandboxKey(%q): %v: want ErrInvalid", c.in, err)
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
