package client

import (
	"errors"
	"net/http"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// FuzzCatTrailer: a cat response's error trailer, whatever a peer sends,
// never panics and never reads as a complete file unless it says so: it
// is nil only for "none", else a problem or ErrUnavailable.
func FuzzCatTrailer(f *testing.F) {
	for _, s := range []string{"none", "", `{"detail":"checkpoint x: packs/ab/cd: hash mismatch","class":"corrupt"}`,
		`{"detail":""}`, `{`, "none ", `{"detail":"x","class":"evil"}`} {
		f.Add(s)
	}
	if catTrailerError(http.Header{}, "ref", "/p") == nil {
		f.Fatal("a missing trailer reads as a complete file")
	}
	f.Fuzz(func(t *testing.T, v string) {
		err := catTrailerError(http.Header{api.CatErrorTrailer: {v}}, "ref", "/p")
		if err == nil {
			if v != api.CatComplete {
				t.Fatalf("trailer %q reads as a complete file", v)
			}
			return
		}
		var p *api.Problem
		if !errors.As(err, &p) && !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("trailer %q: %v is neither a problem nor unavailable", v, err)
		}
		if p != nil && p.Detail == "" {
			t.Fatalf("trailer %q: a problem without a message", v)
		}
	})
}
