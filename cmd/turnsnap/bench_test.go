package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/bench/harness"
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

// A session recorded outside the project in the neutral form (issue 26's
// "Done when"): python3, sqlite and git on the cached Debian image, a
// detached dev server, a verifier and an end probe. `bench convert` makes
// the v2 trace and bench runs it unchanged: valid (its fault-free run
// passes), turnsnap and full_per_turn recover it, and turnsnap's end probe
// answers what the fault-free run's did.
func TestBenchNeutralDebian(t *testing.T) {
	testenv.RequireRoot(t)
	busyboxBase(t) // runc, CRIU
	if _, err := harness.ImagePath(harness.DefaultCache(), "debian-bookworm"); err != nil {
		testenv.Missing(t, "the debian-bookworm image", err.Error())
	}
	dir := t.TempDir()
	check := "import urllib.request, sqlite3\n" +
		"assert open('a.txt').read().strip() == '3'\n" +
		"assert open('b.txt').read().strip() == '42'\n" +
		"assert sqlite3.connect('db.sqlite').execute('select x from t').fetchone()[0] == 42\n" +
		"assert b'calc.py' in urllib.request.urlopen('http://127.0.0.1:8000/', timeout=10).read()\n"
	neutral := map[string]any{
		"name": "neutral-py", "image": map[string]string{"name": "debian-bookworm"}, "cwd": "/work",
		"files": []map[string]string{
			{"path": "/work/calc.py", "content": "import sys\nprint(sum(int(a) for a in sys.argv[1:]))\n"},
			{"path": "/work/check.py", "content": check},
			{"path": "/work/blob.bin", "content_b64": "AAEC/w=="},
			{"path": "/work/wait.py", "content": "import time, urllib.request\nfor i in range(200):\n    try:\n        urllib.request.urlopen('http://127.0.0.1:8000/', timeout=1)\n        break\n    except OSError:\n        time.sleep(0.05)\n"},
		},
		"turns": []map[string]any{
			{"latency_ms": 800, "actions": []map[string]any{{"run": "python3 calc.py 1 2 > a.txt"}}},
			{"latency_ms": 800, "actions": []map[string]any{
				{"start": "exec python3 -m http.server 8000 --bind 127.0.0.1", "name": "web"},
				// The agent waits for the server to answer, as a dev
				// session does: a checkpoint of a server still starting
				// restores one that binds its port after the restore,
				// which turnsnap's restore check refuses (reported).
				{"run": "python3 wait.py"},
				{"run": `python3 -c 'import sqlite3; c = sqlite3.connect("db.sqlite"); c.execute("create table t(x)"); c.execute("insert into t values (41)"); c.commit()'`}}},
			{"latency_ms": 800, "actions": []map[string]any{{"run": "git init -q repo && git -C repo -c user.email=a@b -c user.name=a commit -q --allow-empty -m one"}}},
			{"latency_ms": 800, "actions": []map[string]any{{"run": "python3 calc.py 40 2 > b.txt", "cwd": "/work"}}},
			{"latency_ms": 800, "actions": []map[string]any{{"run": "sqlite3 db.sqlite 'update t set x = x + 1'"}}},
		},
		"verifier":  map[string]any{"run": "python3 check.py", "timeout_ms": 30000},
		"end_probe": map[string]any{"run": "cat a.txt b.txt; sqlite3 db.sqlite 'select x from t'; git -C repo log --format=%s; od -An -tx1 blob.bin"},
	}
	b, _ := json.Marshal(neutral)
	os.WriteFile(filepath.Join(dir, "neutral.json"), b, 0o644)
	traces := filepath.Join(dir, "traces")
	os.MkdirAll(traces, 0o755)
	if stdout, stderr, code := cliRun(t, t.TempDir(), "bench", "convert", filepath.Join(dir, "neutral.json"), filepath.Join(traces, "neutral-py.json")); code != 0 {
		t.Fatalf("bench convert: exit %d\n%s\n%s", code, stdout, stderr)
	}
	out := filepath.Join(dir, "out")
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
	if len(sum.Errors) > 0 || len(sum.Invalid) > 0 {
		res, _ := os.ReadFile(filepath.Join(out, "result.json"))
		t.Fatalf("errors %v, invalid %+v\n%s", sum.Errors, sum.Invalid, res)
	}
	for _, m := range []string{"fault_free", "turnsnap", "full_per_turn"} {
		if c := sum.Methods[m].RecoveryCorrectness; c == nil || *c != 1 {
			t.Errorf("%s: correctness %v, want 1\n%s", m, c, stdout)
		}
	}
	if c := sum.Methods["chat_only"].RecoveryCorrectness; c == nil || *c != 0 {
		t.Errorf("chat_only lost the dev server and the first turns; correctness %v, want 0", c)
	}
	if p := sum.Methods["turnsnap"].EndProbeMatch; p == nil || *p != 1 {
		t.Errorf("turnsnap end probe match %v, want 1\n%s", p, stdout)
	}
}
