package report

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/bench/harness"
)

// Write makes every file; each SVG is well-formed XML whose text is
// escaped; REPORT.md has a row per method and per trace; result.json
// decodes to the same summary.
func TestWrite(t *testing.T) {
	yes := true
	res := &harness.Result{Seeds: 1, Runs: []*harness.Run{
		{Trace: "a<b", Seed: 1, Method: harness.FaultFree, Correct: true, WorkMS: 1000},
		{Trace: "a<b", Seed: 1, Method: harness.Turnsnap, CrashTurn: 3, Correct: true, StateEquivalent: &yes, CkptMS: []float64{1, 2, 300},
			ExposedMS: []float64{0, 3, 30}, Overlapped: 3, PauseMS: []float64{7}, WorkMS: 1040, BytesUploaded: 4096,
			BytesStored: 100, Classes: map[string]int{"skip": 2, "fs": 1}},
		{Trace: "a<b", Seed: 1, Method: harness.FullPerTurn, CrashTurn: 3, Correct: true, CkptMS: []float64{50, 60, 70}, BytesStored: 5000},
		{Trace: "a<b", Seed: 1, Method: harness.ChatOnly, CrashTurn: 3, BytesUploaded: -1},
		{Trace: "a<b", Seed: 1, Method: harness.ChatFS, CrashTurn: 3, CkptMS: []float64{1, 2, 3}, BytesStored: 90},
	}, Colocate: []*harness.ColoResult{{N: 4, WallMS: map[string]float64{harness.FaultFree: 1000, harness.Turnsnap: 1010, harness.FullPerTurn: 1500},
		Slowdown: map[string]float64{harness.FaultFree: 0, harness.Turnsnap: 0.01, harness.FullPerTurn: 0.5}}}}
	sum := harness.Summarise(res)
	// Overhead is the gate's delays (3+30 ms of the 300 ms checkpoints)
	// over fault-free's 1000 ms, not the checkpoints' own time.
	if m := sum.Methods[harness.Turnsnap]; *m.RecoveryCorrectness != 1 || *m.StateEquivalence != 1 || m.Overhead != 0.033 || m.CkptP99MS != 300 ||
		m.ExposedP99MS != 30 || m.Overlapped != 1 || m.Pauses != 1 || m.PauseP50MS != 7 || m.BytesUploaded != 4096 || math.Abs(m.WallOverhead-0.04) > 1e-9 {
		t.Fatalf("turnsnap summary: %+v", m)
	}
	if *sum.Methods[harness.ChatOnly].RecoveryCorrectness != 0 || len(sum.Invalid) != 0 || strings.Contains(Markdown(sum), "INVALID") || sum.Traces[0].Unchanged != 2.0/3 {
		t.Fatalf("summary: %+v %+v", sum.Methods[harness.ChatOnly], sum.Traces)
	}
	dir := t.TempDir()
	if err := Write(dir, res, sum); err != nil {
		t.Fatal(err)
	}
	for _, f := range Files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v", f, err)
		}
		if strings.HasSuffix(f, ".svg") {
			d := xml.NewDecoder(strings.NewReader(string(b)))
			for {
				_, err := d.Token()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%s is not well-formed: %v\n%s", f, err, b)
				}
			}
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "REPORT.md"))
	for _, m := range harness.Methods {
		if !strings.Contains(string(md), "| "+m+" |") {
			t.Errorf("REPORT.md has no row for %s", m)
		}
	}
	if !strings.Contains(string(md), "| a<b | 3 | 2 | 1 |") || !strings.Contains(string(md), "| 4 |") {
		t.Errorf("REPORT.md trace or co-location rows:\n%s", md)
	}
	var back struct{ Summary *harness.Summary }
	b, _ := os.ReadFile(filepath.Join(dir, "result.json"))
	if err := json.Unmarshal(b, &back); err != nil || back.Summary.Methods[harness.FullPerTurn].BytesStored != 5000 {
		t.Fatalf("result.json: %v", err)
	}
}

// A trace whose fault-free run fails its verifier (issue 26: every method
// failed and the report still said "state equivalence 100%") is INVALID in
// the report and the JSON, and its runs count in no correctness figure; a
// valid trace next to it keeps its figures.
func TestInvalidTrace(t *testing.T) {
	yes := true
	res := &harness.Result{Seeds: 1, Runs: []*harness.Run{
		{Trace: "broken", Seed: 1, Method: harness.FaultFree, Correct: false, VerifyOut: "python3: not found\n"},
		{Trace: "broken", Seed: 1, Method: harness.Turnsnap, CrashTurn: 2, Correct: false, StateEquivalent: &yes},
		{Trace: "broken", Seed: 1, Method: harness.ChatOnly, CrashTurn: 2, Correct: false},
	}}
	sum := harness.Summarise(res)
	if len(sum.Invalid) != 1 || sum.Invalid[0].Trace != "broken" || !strings.Contains(sum.Invalid[0].Reason, "python3: not found") {
		t.Fatalf("invalid: %+v", sum.Invalid)
	}
	for m, ms := range sum.Methods {
		if ms.RecoveryCorrectness != nil || ms.StateEquivalence != nil || ms.ValidRuns != 0 {
			t.Errorf("%s: a figure from an invalid trace: %+v", m, ms)
		}
	}
	if sum.Traces[0].Invalid == "" {
		t.Errorf("trace summary not marked invalid: %+v", sum.Traces[0])
	}
	md := Markdown(sum)
	if !strings.Contains(md, "- INVALID: trace broken seed 1: fault-free run failed its verifier: python3: not found") ||
		strings.Contains(md, "100.0%") || !strings.Contains(md, "| turnsnap | 1 | INVALID (no valid trace) | - |") ||
		!strings.Contains(md, "| broken (INVALID) |") {
		t.Errorf("REPORT.md:\n%s", md)
	}
	js, err := json.Marshal(sum)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"invalid":[{"trace":"broken","seed":1,`) || strings.Contains(string(js), "recovery_correctness") ||
		strings.Contains(string(js), "state_equivalence") {
		t.Errorf("JSON: %s", js)
	}

	// A valid trace beside it keeps its figures, from its runs only.
	res.Runs = append(res.Runs,
		&harness.Run{Trace: "good", Seed: 1, Method: harness.FaultFree, Correct: true},
		&harness.Run{Trace: "good", Seed: 1, Method: harness.Turnsnap, CrashTurn: 2, Correct: true, StateEquivalent: &yes},
		&harness.Run{Trace: "good", Seed: 1, Method: harness.ChatOnly, CrashTurn: 2, Correct: false})
	sum = harness.Summarise(res)
	ts, co := sum.Methods[harness.Turnsnap], sum.Methods[harness.ChatOnly]
	if ts.ValidRuns != 1 || *ts.RecoveryCorrectness != 1 || *ts.StateEquivalence != 1 || *co.RecoveryCorrectness != 0 || len(sum.Invalid) != 1 {
		t.Fatalf("with a valid trace: turnsnap %+v chat_only %+v", ts, co)
	}
	if md := Markdown(sum); !strings.Contains(md, "| turnsnap | 2 | 100.0% of 1 | 100.0% |") || !strings.Contains(md, "INVALID: trace broken") {
		t.Errorf("REPORT.md:\n%s", md)
	}
}
