package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Run as nobody, turnsnap says at once that it needs root, exit 5, and
// touches nothing (the home is not even created).
func TestCLINotRoot(t *testing.T) {
	testenv.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Missing(t, "setpriv", "apt package util-linux")
	}
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // nobody must reach the binary
	}
	bin := filepath.Join(dir, "turnsnap")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	io.Copy(dst, src)
	src.Close()
	dst.Close()
	home := filepath.Join(dir, "home")
	for _, args := range [][]string{{"log", "x"}, {"sandbox", "list"}, {"status"}} {
		cmd := exec.Command(setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", bin, "--home", home}, args...)...)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != exitPrecondition || errb.String() != "turnsnap must run as root: overlay mounts, runc, CRIU\n" || out.Len() != 0 {
			t.Fatalf("turnsnap %v as nobody: exit %d, stderr %q, stdout %q", args, code, errb.String(), out.String())
		}
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Fatalf("a refused command created the home: %v", err)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "--help")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Usage:") {
		t.Fatalf("--help as nobody: %v %s", err, out)
	}
}

// Exit codes by class: a damaged ref is corruption (7) though decoding it
// also fails a validity check; errors name their subject once; every
// command's duration_ms is a number of milliseconds.
func TestCLIErrorClassesAndDurations(t *testing.T) {
	testenv.RequireRoot(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() {
		for _, n := range []string{"agent", "b"} {
			run(t, home, "sandbox", "rm", n)
		}
	})
	durations := map[string]float64{}
	measure := func(what string, args ...string) map[string]any {
		t.Helper()
		var m map[string]any
		runJSON(t, home, &m, args...)
		d, ok := m["duration_ms"].(float64)
		if !ok || d <= 0 {
			t.Fatalf("%s: duration_ms %v (%T), want a positive number of milliseconds", what, m["duration_ms"], m["duration_ms"])
		}
		durations[what] = d
		return m
	}
	created := measure("sandbox create", "sandbox", "create", "agent", "--base", base)
	os.WriteFile(filepath.Join(created["root"].(string), "x"), []byte("x"), 0o644)
	ck := measure("checkpoint", "checkpoint", "agent")
	id := ck["id"].(string)
	measure("branch", "branch", id, "b")
	measure("rollback", "rollback", "agent", id)
	measure("gc", "gc", "--grace", "0s")
	measure("catalog rebuild", "catalog", "rebuild")
	if durations["sandbox create"] > 60_000 {
		t.Fatalf("sandbox create took %v ms: not milliseconds?", durations["sandbox create"])
	}

	for _, tc := range []struct {
		subject string
		code    int
		args    []string
	}{
		{"agnet", exitNotFound, []string{"checkpoint", "agnet"}},
		{"agnet", exitNotFound, []string{"diff", "agnet"}},
		{"agnet", exitNotFound, []string{"ps", "agnet"}},
		{"agnet", exitNotFound, []string{"forget", "agnet", "--keep-last", "1"}},
		{"agnet", exitNotFound, []string{"policy", "set", "agnet", "--keep-last", "1"}},
		{"agnet", exitNotFound, []string{"policy", "show", "agnet"}},
		{"agnet", exitNotFound, []string{"sandbox", "rm", "agnet"}},
		{"agnet", exitNotFound, []string{"log", "agnet"}},
		{"123456789abc", exitNotFound, []string{"branch", "123456789abc", "c"}},
		{"123456789abc", exitNotFound, []string{"tag", "t1", "123456789abc"}},
		{"123456789abc", exitNotFound, []string{"verify", "123456789abc"}},
		{"-1", exitUsage, []string{"checkpoint", "agent", "--turn", "-1"}}, // even on a skip turn
	} {
		out, code := run(t, home, tc.args...)
		if code != tc.code || strings.Count(out, tc.subject) != 1 {
			t.Errorf("turnsnap %v: exit %d (want %d), %q names %s %d times, want once", tc.args, code, tc.code, out, tc.subject, strings.Count(out, tc.subject))
		}
	}

	// A head ref that is not an id: corrupt (7), named, for a strict rebuild
	// and the store-only verify alike; a rebuild skips it, naming it, and
	// exits 10 (partial), keeping this home's head of the sandbox.
	heads, _ := filepath.Glob(filepath.Join(home, "store", "refs", "heads", "*"))
	if len(heads) == 0 {
		t.Fatal("no head refs in the store")
	}
	os.WriteFile(heads[0], []byte("not-an-id\n"), 0o600)
	name := "refs/heads/" + filepath.Base(heads[0])
	for _, args := range [][]string{{"catalog", "rebuild", "--strict"}, {"verify", "--store-only"}} {
		if out, code := run(t, home, args...); code != exitCorrupt || strings.Count(out, name) != 1 {
			t.Errorf("turnsnap %v over a damaged ref: exit %d, want %d naming %s once: %s", args, code, exitCorrupt, name, out)
		}
	}
	if out, code := run(t, home, "catalog", "rebuild"); code != exitPartial || !strings.Contains(out, "skipped "+name+" (corrupt)") {
		t.Errorf("turnsnap catalog rebuild over a damaged ref: exit %d, want %d naming %s: %s", code, exitPartial, name, out)
	}
	var list []struct{ Name string }
	runJSON(t, home, &list, "sandbox", "list")
	if len(list) != 2 {
		t.Errorf("sandboxes after a partial rebuild: %+v, want agent and b (this home's heads kept)", list)
	}
}
