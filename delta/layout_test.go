package delta

import (
	"errors"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestLockStale(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name      string
		lock      Lock
		mod       time.Time
		wantStale bool
	}{
		{"fresh by body", Lock{Refreshed: now.Add(-time.Second), StaleAfterNs: int64(5 * time.Second)}, now.Add(-time.Hour), false},
		{"old by both", Lock{Refreshed: now.Add(-6 * time.Second), StaleAfterNs: int64(5 * time.Second)}, now.Add(-6 * time.Second), true},
		{"fresh by mod time", Lock{Refreshed: now.Add(-time.Hour), StaleAfterNs: int64(5 * time.Second)}, now.Add(-time.Second), false},
		{"legacy within default", Lock{}, now.Add(-9 * time.Minute), false},
		{"legacy past default", Lock{}, now.Add(-11 * time.Minute), true},
	} {
		if got := c.lock.Stale(c.mod, now); got != c.wantStale {
			t.Errorf("%s: stale %v, want %v", c.name, got, c.wantStale)
		}
	}
}

func TestSandboxIdentity(t *testing.T) {
	base := Hash([]byte("base"))
	legacy := Sandbox{Name: "s", Backend: "overlay", BaseTree: base}
	if legacy.Key() != "s" || legacy.Validate() != nil {
		t.Fatalf("legacy sandbox: key %q, %v", legacy.Key(), legacy.Validate())
	}
	id := NewSandboxID()
	if !ValidSandboxID(id) || id == NewSandboxID() {
		t.Fatalf("sandbox id %q", id)
	}
	sb := Sandbox{ID: id, Home: NewSandboxID(), Name: "s", Backend: "overlay", BaseTree: base}
	if string(sb.Key()) != id || sb.Validate() != nil || SandboxObject(sb.Key()) != "sandboxes/"+id {
		t.Fatalf("id'd sandbox: key %q, %v", sb.Key(), sb.Validate())
	}
	for _, bad := range []string{"ABCDEF0123456789abcdef0123456789", "abc", id + "0", "../../../../../../../../../../../x"} {
		if ValidSandboxID(bad) {
			t.Errorf("ValidSandboxID(%q)", bad)
		}
		sb.ID = bad
		if sb.Validate() == nil {
			t.Errorf("a description with id %q validates", bad)
		}
	}
}

func FuzzDecodeSandbox(f *testing.F) {
	id := "0123456789abcdef0123456789abcdef"
	f.Add("sandboxes/"+id, []byte(`{"id":"`+id+`","name":"s","backend":"overlay","base_tree":"`+Hash(nil).String()+`","origin":"","created":"2026-12-01T00:00:00Z"}`))
	f.Add("sandboxes/s", []byte(`{"name":"s","backend":"btrfs","base_tree":"`+Hash(nil).String()+`","config":{"pool":"/p"}}`))
	f.Add("sandboxes/x", []byte(`{"name":"s"`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		sb, err := DecodeSandbox(name, data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		if sb.Validate() != nil || SandboxObject(sb.Key()) != name {
			t.Fatalf("accepted %+v under %s", sb, name)
		}
	})
}
