package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/killpoint"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
	"github.com/turnsnap/turnsnap/proc"
)

// runMainEnv makes the test binary act as the turnsnap binary, so tests can
// run (and SIGKILL) real turnsnap processes without building one.
const runMainEnv = "TURNSNAP_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		// Under killpoint.Run (catalog_kill_test.go): stop at file calls.
		if err := killpoint.Trap(os.Getenv(killpoint.TrapEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		main()
		os.Exit(0)
	}
	if spec := os.Getenv(turnsClientEnv); spec != "" {
		if err := turnsClient(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// cli starts the test binary as `turnsnap --home home args...`.
// An env that arms a test hook needs the hooks compiled in: without the
// build tag the hook would silently not fire and the test would wait for it.
func cli(home string, env []string, args ...string) *exec.Cmd {
	for _, kv := range env {
		if strings.HasPrefix(kv, "TURNSNAP_TEST_") && !testhook.Enabled {
			panic(kv + " needs the test hooks: go test -tags turnsnaptest")
		}
	}
	cmd := exec.Command(os.Args[0], append([]string{"--home", home}, args...)...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	return cmd
}

// cliRun runs turnsnap to completion and returns stdout, stderr, exit code.
func cliRun(t *testing.T, home string, args ...string) (string, string, int) {
	t.Helper()
	cmd := cli(home, nil, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("turnsnap %v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

func mustCLI(t *testing.T, home string, args ...string) (string, string) {
	t.Helper()
	out, errs, code := cliRun(t, home, args...)
	if code != 0 {
		t.Fatalf("turnsnap %v: exit %d: %s %s", args, code, out, errs)
	}
	return out, errs
}

// frozen reads the freezer state of the sandbox's container straight from
// its cgroup, without turnsnap (which would heal it). The runc state root
// and the container id derive from the home as engine/procs says (procs.go).
func frozen(t *testing.T, home, sandbox string) bool {
	t.Helper()
	sum := sha256.Sum256([]byte(home))
	scope := hex.EncodeToString(sum[:6])
	b, err := os.ReadFile(filepath.Join("/run/turnsnap", scope, "runc", "ts-"+scope+"-"+sandbox, "state.json"))
	if err != nil {
		t.Fatalf("container state: %v", err)
	}
	var st struct {
		Cgroups map[string]string `json:"cgroup_paths"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.ReadFile(filepath.Join(st.Cgroups["freezer"], "freezer.state"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(f)) != "THAWED"
}

func workLeft(t *testing.T, home string) []string {
	ents, _ := os.ReadDir(filepath.Join(home, "proc", "work"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// counterValue reads the counter the sandbox's process keeps in /tmp/count.
func counterValue(t *testing.T, home, sandbox string) int {
	t.Helper()
	out, _ := mustCLI(t, home, "exec", sandbox, "--", "cat", "/tmp/count")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("counter: %q", out)
	}
	return n
}

// A turnsnap killed with SIGKILL at any phase of a checkpoint leaves no
// frozen container and no process image behind once the next command ran,
// loses nothing of the turn's files, and the next checkpoint is correct.
func TestCheckpointKilledAtEveryPhase(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "apt package runc")
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", proc.DefaultCRIUPath())
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "busybox", "apt package busybox-static")
	}
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	os.WriteFile(filepath.Join(base, "bin/busybox"), bb, 0o755)
	for _, a := range []string{"sh", "sleep", "cat", "mv", "echo"} {
		os.Symlink("busybox", filepath.Join(base, "bin", a))
	}
	var names []string
	t.Cleanup(func() {
		for _, n := range names {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})
	names = append(names, "k")
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "k", "--base", base, "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatal(err)
	}
	// A process that is busy every turn, so every checkpoint freezes and dumps.
	mustCLI(t, home, "exec", "--detach", "k", "--", "sh", "-c",
		`n=0; while :; do n=$((n+1)); echo $n > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done`)
	mustCLI(t, home, "checkpoint", "k")

	for _, phase := range []string{engine.PhaseFreeze, engine.PhaseScan, engine.PhaseDump, engine.PhaseStore, engine.PhaseCommit, engine.PhaseRecorded} {
		file := "turn-" + phase
		if err := os.WriteFile(filepath.Join(created.Root, file), []byte(phase), 0o644); err != nil {
			t.Fatal(err)
		}
		flag := filepath.Join(t.TempDir(), "reached")
		cmd := cli(home, []string{testhook.BlockAtEnv + "=" + phase + ":" + flag}, "checkpoint", "k")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := os.Stat(flag); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("%s: turnsnap never reached the phase", phase)
			}
			time.Sleep(10 * time.Millisecond)
		}
		cmd.Process.Kill() // SIGKILL
		cmd.Wait()
		paused := phase == engine.PhaseFreeze || phase == engine.PhaseScan || phase == engine.PhaseDump
		if got := frozen(t, home, "k"); got != paused {
			t.Fatalf("%s: killed turnsnap left the container frozen=%v, expected %v at this phase", phase, got, paused)
		}
		imageLeft := phase == engine.PhaseDump || phase == engine.PhaseStore
		if left := workLeft(t, home); (len(left) > 0) != imageLeft {
			t.Fatalf("%s: work dirs after the kill %v, expected an image left: %v", phase, left, imageLeft)
		}

		// The next command heals the sandbox and says what it did.
		out, errs := mustCLI(t, home, "checkpoint", "k", "--json")
		if paused && !strings.Contains(errs, "left frozen") {
			t.Fatalf("%s: the next checkpoint did not say it resumed the container: %q", phase, errs)
		}
		if imageLeft && !strings.Contains(errs, "removed a process image") {
			t.Fatalf("%s: the next checkpoint did not say it removed the image: %q", phase, errs)
		}
		var c struct{ ID, Class string }
		if err := json.Unmarshal([]byte(out), &c); err != nil {
			t.Fatal(err)
		}
		if c.Class != "full" {
			t.Fatalf("%s: the turn after the kill (a new file, a busy process) classed %q", phase, c.Class)
		}
		if frozen(t, home, "k") {
			t.Fatalf("%s: still frozen after the next checkpoint", phase)
		}
		if left := workLeft(t, home); len(left) > 0 {
			t.Fatalf("%s: work dirs left %v", phase, left)
		}
		n := counterValue(t, home, "k")
		deadline = time.Now().Add(30 * time.Second)
		for counterValue(t, home, "k") <= n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the process does not run again", phase)
			}
		}
		// The checkpoint holds the turn's file and restorable processes.
		b := "b-" + phase
		names = append(names, b)
		var br struct {
			Root      string
			Processes bool
		}
		out, _ = mustCLI(t, home, "branch", c.ID, b, "--json")
		if err := json.Unmarshal([]byte(out), &br); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(br.Root, file)); err != nil || string(got) != phase || !br.Processes {
			t.Fatalf("%s: branch of the next checkpoint: file %q (%v), processes %v", phase, got, err, br.Processes)
		}
		if counterValue(t, home, b) < n/2 {
			t.Fatalf("%s: the branch's counter restarted", phase)
		}
		mustCLI(t, home, "sandbox", "rm", b)
	}
}
