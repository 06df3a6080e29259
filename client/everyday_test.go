package client

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Cat never takes a cut-short stream for a whole file: a connection the
// server dropped mid-body, a body without the trailer and a corrupt
// problem in the trailer are all errors, of their class. (A stand-in
// server on 127.0.0.1 plays each peer; the real route and its damaged
// chunk are tested in server and cmd/turnsnap.)
func TestCatIncompleteStreams(t *testing.T) {
	corrupt := `{"type":"x","title":"corrupt","status":422,"detail":"checkpoint abc: /f: object packs/ab/cd: hash mismatch","class":"corrupt"}`
	for _, tc := range []struct {
		name  string
		h     http.HandlerFunc
		class error
	}{
		{"complete", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", api.CatErrorTrailer)
			w.Write([]byte("hello"))
			w.Header().Set(api.CatErrorTrailer, "none")
		}, nil},
		{"connection dropped", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", api.CatErrorTrailer)
			w.Write([]byte("hello"))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}, errdefs.ErrUnavailable},
		{"no trailer", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("hello"))
		}, errdefs.ErrUnavailable},
		{"corrupt in the trailer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", api.CatErrorTrailer)
			w.Write([]byte("hello"))
			w.Header().Set(api.CatErrorTrailer, corrupt)
		}, errdefs.ErrCorrupt},
		{"garbage trailer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", api.CatErrorTrailer)
			w.Write([]byte("hello"))
			w.Header().Set(api.CatErrorTrailer, "{nope")
		}, errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			c, err := New(Options{URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err = c.Cat(context.Background(), "abc", "/f", &out)
			if out.String() != "hello" {
				t.Errorf("got %q", out.String())
			}
			switch {
			case tc.class == nil && err != nil:
				t.Fatalf("complete file: %v", err)
			case tc.class != nil && !errors.Is(err, tc.class):
				t.Fatalf("%v, want %v", err, tc.class)
			}
			if tc.class == errdefs.ErrCorrupt && !strings.Contains(err.Error(), "packs/ab/cd") {
				t.Fatalf("the corrupt error does not name the object: %v", err)
			}
		})
	}
}
