package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/bench/report"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// The quick bench (make test): one trace (a database holding its rows only
// in memory), one seed, the crash forced two turns after the process
// started, through a real daemon that the bench SIGKILLs and restarts.
// turnsnap and full_per_turn recover to a state the verifier accepts,
// chat_only does not, turnsnap's restored state equals the checkpoint's,
// it stores fewer bytes than full_per_turn, and the report's files exist.
// Every checkpoint started before its turn's model latency ended (the
// overlap, counted by the harness, not inferred from timings), so the gate
// held the next turn for less than the checkpoints took; the process turns'
// pauses were measured, and the daemon's background pusher uploaded the
// checkpoints to a real MinIO. The model latencies run at a tenth.
func TestBenchQuick(t *testing.T) {
	testenv.RequireRoot(t)
	busyboxBase(t) // the parts it needs: runc, CRIU, busybox
	minio, ok := miniotest.Binary()
	if !ok {
		testenv.Missing(t, "MinIO server", minio+" is not built; scripts/deps.d/40-minio.sh builds it")
	}
	traces := t.TempDir()
	b, err := os.ReadFile("../../bench/traces/memdb.json")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(traces, "memdb.json"), b, 0o644)
	out := filepath.Join(t.TempDir(), "out")
	stdout, stderr, code := cliRun(t, t.TempDir(), "bench", "--traces", traces, "--seeds", "1", "--sandboxes", "0",
		"--crash-after-start", "--latency-scale", "0.1", "--minio", minio, "--out", out, "--work", t.TempDir(), "--json")
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
			ExposedP50MS        float64  `json:"exposed_p50_ms"`
			ExposedP99MS        float64  `json:"exposed_p99_ms"`
			Overlapped          float64  `json:"overlapped"`
			Pauses              int      `json:"pauses"`
			PauseP50MS          float64  `json:"pause_p50_ms"`
			BytesUploaded       int64    `json:"bytes_uploaded"`
		}
		Remote       bool    `json:"remote"`
		LatencyScale float64 `json:"latency_scale"`
		Traces       []struct {
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
	for _, m := range []string{"turnsnap", "full_per_turn", "chat_fs"} {
		if ms := sum.Methods[m]; ms.Overlapped != 1 {
			t.Errorf("%s: %.0f%% of the checkpoints started before the model latency ended; want all (overlapped)", m, ms.Overlapped*100)
		}
	}
	if ts.ExposedP50MS >= *ts.CkptP50MS || full.ExposedP50MS >= *full.CkptP50MS {
		t.Errorf("the gate's median delay (turnsnap %.1f ms, full %.1f ms) is not below the median checkpoint (%.1f, %.1f ms): the latency hid nothing",
			ts.ExposedP50MS, full.ExposedP50MS, *ts.CkptP50MS, *full.CkptP50MS)
	}
	if ts.Pauses == 0 || ts.PauseP50MS <= 0 || full.Pauses == 0 {
		t.Errorf("the database turns pause its process: turnsnap %d pauses (p50 %.1f ms), full_per_turn %d", ts.Pauses, ts.PauseP50MS, full.Pauses)
	}
	if !sum.Remote || ts.BytesUploaded <= 0 || sum.LatencyScale != 0.1 {
		t.Errorf("remote %v: turnsnap uploaded %d bytes of the %d it stored (want some); latency scale %v",
			sum.Remote, ts.BytesUploaded, ts.BytesStored, sum.LatencyScale)
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
// So are a latency scale out of range, a MinIO binary that is not there and
// a co-location-only run without sandboxes.
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
	for _, bad := range [][]string{{"--latency-scale", "0"}, {"--latency-scale", "11"}, {"--minio", filepath.Join(dir, "no-minio")},
		{"--colocation-only", "--sandboxes", "0"}} {
		_, stderr, code = cliRun(t, t.TempDir(), append([]string{"bench", "--traces", dir, "--out", out}, bad...)...)
		if code != exitUsage || !strings.Contains(stderr, bad[0]) {
			t.Errorf("bench %v: exit %d (want %d), %s", bad, code, exitUsage, stderr)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused bench wrote its output directory")
	}
}

// Traces written outside the project (issue 26): a version 2 trace (a
// binary base file, a working directory, a start that must run before the
// command after it in the same turn, an end probe) runs as written, and a
// trace whose fault-free run fails its verifier is reported INVALID, with
// no correctness figure from its runs, in the JSON and in REPORT.md.
func TestBenchV2AndInvalid(t *testing.T) {
	testenv.RequireRoot(t)
	busyboxBase(t)
	traces := t.TempDir()
	// Turn 1: the command reads the fifo the process writes; run before
	// the start (v1's order) it would block until its 3 s timeout and
	// leave seen.txt empty, failing the verifier.
	v2 := `{"version": 2, "name": "v2order", "cwd": "/work",
 "base": {"files": [{"path": "work/blob.bin", "content_b64": "AAEC/w==", "mode": "0600"}]},
 "probe": {"cmd": "cat state.txt; od -An -tx1 blob.bin"},
 "verify": {"cmd": "grep -x hi reply.txt && test \"$(od -An -tx1 blob.bin | tr -d ' \\n')\" = 000102ff"},
 "turns": [
  {"steps": [{"cmd": "mkfifo f"},
             {"start": {"name": "w", "cmd": "echo hi > f; exec sleep 100000"}},
             {"cmd": "cat f > seen.txt", "timeout_ms": 3000},
             {"cmd": "rm f"}], "model_latency_ms": 100},
  {"steps": [{"cmd": "echo one >> state.txt"}], "model_latency_ms": 100},
  {"steps": [{"cmd": "echo two >> state.txt"}], "model_latency_ms": 100},
  {"steps": [{"cmd": "cp seen.txt reply.txt", "cwd": "/work"}], "model_latency_ms": 100}]}`
	broken := `{"name": "broken", "verify": {"cmd": "echo needs python3 >&2; test -x /usr/bin/python3"},
 "turns": [{"cmds": ["true"]}, {"cmds": ["true"]}, {"cmds": ["true"]}]}`
	os.WriteFile(filepath.Join(traces, "v2order.json"), []byte(v2), 0o644)
	os.WriteFile(filepath.Join(traces, "broken.json"), []byte(broken), 0o644)
	out := filepath.Join(t.TempDir(), "out")
	stdout, stderr, code := cliRun(t, t.TempDir(), "bench", "--traces", traces, "--seeds", "1", "--sandboxes", "0",
		"--crash-after-start", "--latency-scale", "0.1", "--minio", "none", "--out", out, "--work", t.TempDir(), "--json")
	if code != 0 {
		t.Fatalf("turnsnap bench: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var sum struct {
		Methods map[string]struct {
			ValidRuns           int      `json:"valid_runs"`
			RecoveryCorrectness *float64 `json:"recovery_correctness"`
			EndProbeMatch       *float64 `json:"end_probe_match"`
		}
		Invalid []struct{ Trace, Reason string }
		Errors  []string
	}
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout)
	}
	if len(sum.Errors) > 0 {
		t.Fatalf("bench runs failed: %v", sum.Errors)
	}
	if len(sum.Invalid) != 1 || sum.Invalid[0].Trace != "broken" || !strings.Contains(sum.Invalid[0].Reason, "needs python3") {
		t.Fatalf("invalid traces: %+v\n%s", sum.Invalid, stdout)
	}
	for m, want := range map[string]float64{"fault_free": 1, "turnsnap": 1, "full_per_turn": 1, "chat_only": 0} {
		ms := sum.Methods[m]
		if ms.ValidRuns != 1 || ms.RecoveryCorrectness == nil || *ms.RecoveryCorrectness != want {
			t.Errorf("%s: valid runs %d, correctness %v; want 1 run (v2order only), %v\n%s", m, ms.ValidRuns, ms.RecoveryCorrectness, want, stdout)
		}
	}
	for m, want := range map[string]float64{"turnsnap": 1, "full_per_turn": 1, "chat_fs": 1, "chat_only": 0} {
		if p := sum.Methods[m].EndProbeMatch; p == nil || *p != want {
			t.Errorf("%s: end probe match %v, want %v", m, p, want)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "REPORT.md"))
	if err != nil || !strings.Contains(string(md), "- INVALID: trace broken seed 1: fault-free run failed its verifier: needs python3") ||
		!strings.Contains(string(md), "| broken (INVALID) |") {
		t.Errorf("REPORT.md (%v):\n%s", err, md)
	}
}
