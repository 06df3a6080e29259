package killpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// childEnv makes the test binary the traced child: it changes files in the
// directory the variable names, and starts no other program.
const childEnv = "TURNSNAP_KILLPOINT_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		if err := Trap(os.Getenv(TrapEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := child(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child creates a, writes it, truncates it, renames it to b, creates c and
// removes it: one of each call Run names.
func child(dir string) error {
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	f, err := os.Create(a)
	if err != nil {
		return err
	}
	if _, err := f.Write([]byte("hello")); err != nil {
		return err
	}
	if err := f.Truncate(3); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(a, b); err != nil {
		return err
	}
	g, err := os.Create(c)
	if err != nil {
		return err
	}
	if err := g.Close(); err != nil {
		return err
	}
	return os.Remove(c)
}

var allCalls = []string{"create a", "write a", "ftruncate a to 3", "rename a to b", "create c", "unlink c"}

func run(t *testing.T, kill func(string) bool) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	calls, err := Run(context.Background(), []string{os.Args[0]}, []string{childEnv + "=" + dir},
		[]*os.File{nil, os.Stderr, os.Stderr}, dir, kill)
	if errors.Is(err, ErrUnsupported) {
		testenv.Missing(t, "ptrace and seccomp", err.Error())
	}
	if err != nil {
		t.Fatalf("Run: %v (calls %q)", err, calls)
	}
	return dir, calls
}

// Untouched, the child runs to the end and every file call is named.
func TestRunNamesCalls(t *testing.T) {
	dir, calls := run(t, func(string) bool { return false })
	if !slices.Equal(calls, allCalls) {
		t.Fatalf("calls %q, want %q", calls, allCalls)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "b")); err != nil || string(data) != "hel" {
		t.Fatalf("b holds %q (%v), want the child's finished work", data, err)
	}
}

// Killed at a named call, the child dies before the call runs: the
// directory is as the calls before it left it.
func TestRunKillsBeforeTheCall(t *testing.T) {
	dir, calls := run(t, func(call string) bool { return call == "rename a to b" })
	if want := allCalls[:4]; !slices.Equal(calls, want) {
		t.Fatalf("calls %q, want %q", calls, want)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "a")); err != nil || string(data) != "hel" {
		t.Fatalf("a holds %q (%v), want the truncated file the rename never moved", data, err)
	}
	for _, gone := range []string{"b", "c"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s exists (%v) though the child died before making it", gone, err)
		}
	}
}

// Trap refuses a spec it cannot read, and an empty spec is a no-op.
func TestTrapSpec(t *testing.T) {
	if err := Trap(""); err != nil {
		t.Fatalf("Trap(\"\"): %v", err)
	}
	for _, bad := range []string{"x:1", "0xc000003e:1,two"} {
		if err := Trap(bad); err == nil {
			t.Errorf("Trap(%q) accepted a malformed spec", bad)
		}
	}
}

// A child that is not killed must exit 0: a failing one is Run's error.
func TestRunReportsAFailedChild(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent") // the child's first create fails
	calls, err := Run(context.Background(), []string{os.Args[0]}, []string{childEnv + "=" + dir},
		[]*os.File{nil, nil, nil}, dir, func(string) bool { return false })
	if errors.Is(err, ErrUnsupported) {
		testenv.Missing(t, "ptrace and seccomp", err.Error())
	}
	if err == nil {
		t.Fatalf("Run returned no error for a child that exited 1 (calls %q)", calls)
	}
}
