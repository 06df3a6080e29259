package trace

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

const goodNeutral = `{"name": "pyproj", "image": {"name": "debian-bookworm"}, "cwd": "/work",
 "files": [{"path": "/work/app.py", "content": "print(1)\n"}, {"path": "/work/data.bin", "content_b64": "AP8=", "mode": "0600"}],
 "turns": [
  {"latency_ms": 900, "actions": [{"run": "python3 app.py > out.txt"}, {"start": "exec python3 -m http.server 8000"},
                                   {"run": "true", "cwd": "/tmp", "timeout_ms": 5000}]},
  {"latency_ms": 1200, "actions": [{"stop": "p1"}, {"start": "exec sleep 1000", "name": "idle"}]},
  {"latency_ms": 700, "actions": []}],
 "verifier": {"run": "grep -x 1 out.txt"},
 "end_probe": {"run": "cat out.txt", "cwd": "/work"}}`

// The neutral form becomes a v2 trace: paths made relative, the latency
// before turn i+1 closing turn i (the first one dropped), actions in
// order as steps, unnamed starts named in start order; the trace it
// writes parses back to the same trace.
func TestFromNeutral(t *testing.T) {
	tr, err := FromNeutral([]byte(goodNeutral))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Version != 2 || tr.Base.Image.Name != "debian-bookworm" || tr.Base.Files[0].Path != "work/app.py" || tr.Cwd != "/work" ||
		tr.Verify.Cmd != "grep -x 1 out.txt" || tr.Probe.Cwd != "/work" {
		t.Fatalf("converted: %+v", tr)
	}
	lat := []int{tr.Turns[0].ModelLatencyMS, tr.Turns[1].ModelLatencyMS, tr.Turns[2].ModelLatencyMS}
	if !reflect.DeepEqual(lat, []int{1200, 700, 0}) {
		t.Errorf("latencies %v, want [1200 700 0]", lat)
	}
	s0, s1 := tr.Turns[0].Steps, tr.Turns[1].Steps
	if len(s0) != 3 || s0[0].Cmd != "python3 app.py > out.txt" || s0[1].Start.Name != "p1" || s0[2].Cwd != "/tmp" || s0[2].TimeoutMS != 5000 ||
		s1[0].Stop != "p1" || s1[1].Start.Name != "idle" {
		t.Errorf("steps: %+v %+v", s0, s1)
	}
	b, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatalf("the converted trace does not parse: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(back, tr) {
		t.Errorf("round trip:\n%+v\n%+v", back, tr)
	}
}

func TestFromNeutralRejects(t *testing.T) {
	cases := map[string]string{
		"relative path":    strings.Replace(goodNeutral, `"/work/app.py"`, `"work/app.py"`, 1),
		"run and start":    strings.Replace(goodNeutral, `{"run": "python3 app.py > out.txt"}`, `{"run": "x", "start": "y"}`, 1),
		"name on a run":    strings.Replace(goodNeutral, `{"run": "python3 app.py > out.txt"}`, `{"run": "x", "name": "y"}`, 1),
		"stop unknown":     strings.Replace(goodNeutral, `{"stop": "p1"}`, `{"stop": "p9"}`, 1),
		"no verifier":      strings.Replace(goodNeutral, `"grep -x 1 out.txt"`, `""`, 1),
		"unknown field":    strings.Replace(goodNeutral, `"cwd": "/work",`, `"cwd": "/work", "workdir": "/x",`, 1),
		"no turns":         strings.Replace(goodNeutral, `"turns": [`, `"turns": [], "x": [`, 1),
		"trailing data":    goodNeutral + "{}",
		"negative latency": strings.Replace(goodNeutral, `"latency_ms": 1200`, `"latency_ms": -1`, 1),
		"first latency":    strings.Replace(goodNeutral, `"latency_ms": 900`, `"latency_ms": -900`, 1),
		"empty action":     strings.Replace(goodNeutral, `{"stop": "p1"}`, `{}`, 1),
	}
	for name, in := range cases {
		if _, err := FromNeutral([]byte(in)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}
