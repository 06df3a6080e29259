package catalog

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestParseCheckpointRef(t *testing.T) {
	full := strings.Repeat("ab", 32)
	cases := []struct {
		in   string
		want CheckpointRef // text is filled in from in
		bad  bool
	}{
		{in: full, want: CheckpointRef{Base: full}},
		{in: "abcd", want: CheckpointRef{Base: "abcd"}},
		{in: "v1", want: CheckpointRef{Base: "v1"}},
		{in: "v1~", want: CheckpointRef{Base: "v1", Back: 1}},
		{in: "v1~3", want: CheckpointRef{Base: "v1", Back: 3}},
		{in: "v1~2~3", want: CheckpointRef{Base: "v1", Back: 5}},
		{in: "HEAD", want: CheckpointRef{Head: true}},
		{in: "HEAD~2", want: CheckpointRef{Head: true, Back: 2}},
		{in: "box@HEAD", want: CheckpointRef{Head: true, Sandbox: "box"}},
		{in: "box@HEAD~1", want: CheckpointRef{Head: true, Sandbox: "box", Back: 1}},
		{in: "", bad: true},
		{in: "~1", bad: true},
		{in: "v1~x", bad: true},
		{in: "v1~-1", bad: true},
		{in: "v1~123456", bad: true},
		{in: "v1~10000~1", bad: true},
		{in: "box@HEAD^", bad: true},
		{in: "box@v1", bad: true},
		{in: "@HEAD", bad: true},
		{in: ".x@HEAD", bad: true},
	}
	for _, c := range cases {
		r, err := ParseCheckpointRef(c.in)
		if c.bad {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("ParseCheckpointRef(%q) = %+v, %v: want ErrInvalid", c.in, r, err)
			}
			continue
		}
		c.want.text = c.in
		if err != nil || r != c.want || r.String() != c.in {
			t.Errorf("ParseCheckpointRef(%q) = %+v, %v: want %+v", c.in, r, err, c.want)
		}
	}
}

// FuzzParseCheckpointRef checks that what parses is one of the forms: a
// head names a valid sandbox (or none), a base is no head and holds no '@'
// or '~', and Back stays within MaxBack; and that a refusal is ErrInvalid.
func FuzzParseCheckpointRef(f *testing.F) {
	for _, s := range []string{"HEAD", "HEAD~", "s@HEAD~2~3", "abcd", "v1~1", "@", "~", "a@b@HEAD", "x~99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseCheckpointRef(s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("%q: %v is not ErrInvalid", s, err)
			}
			return
		}
		if r.String() != s || r.Back < 0 || r.Back > MaxBack {
			t.Fatalf("%q: %+v", s, r)
		}
		switch {
		case r.Head && r.Sandbox != "" && !delta.ValidRefName(string(r.Sandbox)):
			t.Fatalf("%q: head of invalid sandbox %q", s, r.Sandbox)
		case r.Head && r.Base != "":
			t.Fatalf("%q: head with a base %q", s, r.Base)
		case !r.Head && (r.Base == "" || strings.ContainsAny(r.Base, "@~")):
			t.Fatalf("%q: base %q", s, r.Base)
		}
	})
}
