package demo

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The demo's JSON uses the CLI's conventions: duration_ms as a float of
// milliseconds, counts as <plural noun>_<qualifier>.
func TestReportJSON(t *testing.T) {
	r := Report{Turns: []Turn{{Turn: 1, Duration: 1500 * time.Microsecond}}, Rollback: 2 * time.Millisecond, Verified: 3}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"duration_ms":1.5`, `"rollback_ms":2`, `"checkpoints_verified":3`} {
		if !strings.Contains(s, want) {
			t.Errorf("%s lacks %s", s, want)
		}
	}
	for _, old := range []string{"duration_ns", "rollback_ns", "verified_checkpoints"} {
		if strings.Contains(s, old) {
			t.Errorf("%s still has %s", s, old)
		}
	}
}
