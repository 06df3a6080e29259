package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// FuzzDecodeRequest: the strict request decoder never panics, fails only
// with ErrInvalid, and what it accepts survives a round trip.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"turn":3,"message":"m","wait_remote":true}`, `{"name":"b","count":4}`,
		`{"argv":["sh","-c","x"],"stdin":"aGk="}`, `{"turn":1} {}`, `{"turn":"x"}`, `[1]`, `{"evil":1}`, "\x00",
		`{"sandbox":"s","policy":{"keep_last":2,"keep_tags":["r-*"]},"dry_run":true,"gc":true}`, `{"checkpoint":"t1","paths":["/a"],"to":"/x"}`} {
		f.Add(s)
	}
	s := &Server{maxBody: 1 << 16}
	f.Fuzz(func(t *testing.T, body string) {
		for _, v := range []any{&CheckpointRequest{}, &BranchRequest{}, &ExecRequest{}, &InitRequest{},
			&ForgetRequest{}, &RestorePathsRequest{}, &retention.PolicyOptions{}, &ApplyPoliciesRequest{}} {
			r := httptest.NewRequest("POST", "/v1/x", strings.NewReader(body))
			err := s.decode(httptest.NewRecorder(), r, v)
			if err != nil {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("decode %q: %v is not ErrInvalid", body, err)
				}
				continue
			}
			data, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			again := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			r = httptest.NewRequest("POST", "/v1/x", strings.NewReader(string(data)))
			err = s.decode(httptest.NewRecorder(), r, again)
			if data2, _ := json.Marshal(again); err != nil || string(data) != string(data2) {
				t.Fatalf("round trip of %q: %+v -> %s -> %+v (%v)", body, v, data, again, err)
			}
		}
	})
}

// FuzzCatTrailer: a cat response's error trailer, whatever a peer sends,
// never panics and never reads as a complete file unless it says so: it
// is nil only for "none", else a problem or ErrUnavailable.
func FuzzCatTrailer(f *testing.F) {
	for _, s := range []string{"none", "", `{"detail":"checkpoint x: packs/ab/cd: hash mismatch","class":"corrupt"}`,
		`{"detail":""}`, `{`, "none ", `{"detail":"x","class":"evil"}`} {
		f.Add(s)
	}
	if CatTrailerError(http.Header{}, "ref", "/p") == nil {
		f.Fatal("a missing trailer reads as a complete file")
	}
	f.Fuzz(func(t *testing.T, v string) {
		err := CatTrailerError(http.Header{CatErrorTrailer: {v}}, "ref", "/p")
		if err == nil {
			if v != catComplete {
				t.Fatalf("trailer %q reads as a complete file", v)
			}
			return
		}
		var p *Problem
		if !errors.As(err, &p) && !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("trailer %q: %v is neither a problem nor unavailable", v, err)
		}
		if p != nil && p.Detail == "" {
			t.Fatalf("trailer %q: a problem without a message", v)
		}
	})
}
