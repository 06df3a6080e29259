package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/bench/report"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The quick bench (make test): one trace (a database holding its rows only
// in memory), one seed, the crash forced two turns after the process
// started, through a real daemon that the bench SIGKILLs and restarts.
// turnsnap and full_per_turn recover to a state the verifier accepts,
// chat_only does not, turnsnap's restored state equals the checkpoint's,
// it stores fewer bytes than full_per_turn, and the report's files exist.
func TestBenchQuick(t *testing.T) {
	testenv.RequireRoot(t)
	busyboxBase(t) // the parts it needs: runc, CRIU, busybox
	traces := t.TempDir()
	b, err := os.ReadFile("../../bench/traces/memdb.json")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(traces, "memdb.json"), b, 0o644)
	out := filepath.Join(t.TempDir(), "out")
	stdout, stderr, code := cliRun(t, t.TempDir(), "bench", "--traces", traces, "--seeds", "1", "--sandboxes", "0",
		"--crash-after-start", "--out", out, "--work", t.TempDir(), "--json")
	if code != 0 {
		t.Fatalf("turnsnap bench: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var sum struct {
		Methods map[string]struct {
			RecoveryCorrectness float64  `json:"recovery_correctness"`
			StateEquivalence    *float64 `json:"state_equivalence"`
			Overhead            float64  `json:"overhead"`
			BytesStored         int64    `json:"bytes_stored"`
			CkptP50MS           *float64 `json:"ckpt_p50_ms"`
			CkptP99MS           *float64 `json:"ckpt_p99_ms"`
		}
		Traces []struct {
			Name string
			Mix  map[string]int
		}
		Errors []string
	}
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout)
	}
	if len(sum.Errors) > 0 {
		t.Fatalf("bench runs failed: %v", sum.Errors)
	}
	for _, m := range []string{"turnsnap", "full_per_turn", "chat_only", "chat_fs", "fault_free"} {
		if _, ok := sum.Methods[m]; !ok || sum.Methods[m].CkptP50MS == nil || sum.Methods[m].CkptP99MS == nil {
			t.Fatalf("method %s missing or without latency figures: %s", m, stdout)
		}
	}
	ts, full := sum.Methods["turnsnap"], sum.Methods["full_per_turn"]
	if ts.RecoveryCorrectness != 1 || full.RecoveryCorrectness != 1 || sum.Methods["fault_free"].RecoveryCorrectness != 1 {
		t.Errorf("turnsnap, full_per_turn and fault_free must pass the verifier: %s", stdout)
	}
	if sum.Methods["chat_only"].RecoveryCorrectness != 0 || sum.Methods["chat_fs"].RecoveryCorrectness != 0 {
		t.Errorf("chat_only and chat_fs lose the database's memory; their verifier must fail: %s", stdout)
	}
	if ts.StateEquivalence == nil || *ts.StateEquivalence != 1 {
		t.Errorf("turnsnap state equivalence: %v", ts.StateEquivalence)
	}
	if ts.BytesStored <= 0 || ts.BytesStored >= full.BytesStored {
		t.Errorf("turnsnap stored %d bytes, full_per_turn %d: want 0 < turnsnap < full", ts.BytesStored, full.BytesStored)
	}
	if len(sum.Traces) != 1 || sum.Traces[0].Name != "memdb" || sum.Traces[0].Mix["skip"] == 0 {
		t.Errorf("trace mix: %+v (read-only turns must be skips)", sum.Traces)
	}
	for _, f := range append(report.Files, "audit-memdb.html") {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("report file %s: %v", f, err)
		}
	}
}

// A trace directory with a bad trace is refused before anything starts:
// the error names the file and the problem, the exit code is invalid input.
func TestBenchRejectsBadTraces(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"name":"bad","verify":{"cmd":"true"},"turns":[{}],"surprise":1}`), 0o644)
	out := filepath.Join(t.TempDir(), "out")
	_, stderr, code := cliRun(t, t.TempDir(), "bench", "--traces", dir, "--out", out)
	if code != exitUsage || !strings.Contains(stderr, "bad.json") || !strings.Contains(stderr, "surprise") {
		t.Fatalf("bench with a bad trace: exit %d (want %d), %s", code, exitUsage, stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused bench wrote its output directory")
	}
	_, stderr, code = cliRun(t, t.TempDir(), "bench", "--traces", t.TempDir())
	if code == 0 || !strings.Contains(stderr, "no *.json trace") {
		t.Fatalf("bench with no traces: exit %d, %s", code, stderr)
	}
}
