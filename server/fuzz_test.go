package server

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/api"
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
		for _, v := range []any{&api.CheckpointRequest{}, &api.BranchRequest{}, &api.ExecRequest{}, &api.InitRequest{},
			&api.ForgetRequest{}, &api.RestorePathsRequest{}, &retention.PolicyOptions{}, &api.ApplyPoliciesRequest{}} {
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
