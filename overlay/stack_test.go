package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestStackOptions(t *testing.T) {
	got, err := StackOptions([]string{"/h/bases/.frozen/f", "/h/bases/b"}, "/h/s/gen-1/upper", "/h/s/gen-1/work")
	if err != nil || got != "lowerdir=/h/bases/.frozen/f:/h/bases/b,upperdir=/h/s/gen-1/upper,workdir=/h/s/gen-1/work,"+FeatureOptions {
		t.Fatalf("StackOptions = %q, %v", got, err)
	}
	if got, _ := StackOptions([]string{"/b"}, "/u", "/w"); got != "lowerdir=/b,upperdir=/u,workdir=/w,"+FeatureOptions {
		t.Fatalf("a plain stack: %q", got)
	}
	for _, bad := range [][]string{nil, {"/f:x", "/b"}, {"rel", "/b"}, {"/f", "/g", "/b"}} {
		if _, err := StackOptions(bad, "/u", "/w"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("lowers %q accepted: %v", bad, err)
		}
	}
}

// FuzzReadStack: a stack file is local, but a damaged one must be refused
// (ErrCorrupt or ErrInvalid), never mounted with a path overlay would split.
func FuzzReadStack(f *testing.F) {
	f.Add([]byte(`{"frozen":"/h/bases/.frozen/x","tree":"` + delta.EmptyTree().String() + `","state_key":"` + delta.EmptyTree().String() + `"}`))
	f.Add([]byte(`{"frozen":"/a:b","tree":"00"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := t.TempDir()
		if err := os.WriteFile(filepath.Join(g, stackFileName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := readStack(g)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if s == nil || s.Tree.IsZero() || checkOptionPath(s.Frozen) != nil {
			t.Fatalf("accepted %+v", s)
		}
	})
}
