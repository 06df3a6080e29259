package catalog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/killpoint"
)

// Open in the same process conflicts too: flock locks belong to the open file
// description, not the process.
func TestLockedInProcess(t *testing.T) {
	dir := t.TempDir()
	c := openAt(t, dir)
	_, err := Open(context.Background(), dir, Options{})
	checkInUse(t, err, dir)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	openAt(t, dir) // released by Close
}

func checkInUse(t *testing.T, err error, dir string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
	if want := "catalog " + dir + " is in use by another turnsnap process"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

const (
	helperEnv      = "TURNSNAP_CATALOG_TEST_HOLD"
	helperWriteEnv = "TURNSNAP_CATALOG_TEST_WRITE"
)

// TestMain doubles as the helper process for TestLockedByOtherProcess: run
// with helperEnv naming a directory, the test binary holds that catalog open
// until its stdin closes, instead of running tests.
func TestMain(m *testing.M) {
	if dir := os.Getenv(sessionEnv); dir != "" {
		if err := killpoint.Trap(os.Getenv(killpoint.TrapEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := session(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if dir := os.Getenv(helperEnv); dir != "" {
		c, err := Open(context.Background(), dir, Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if os.Getenv(helperWriteEnv) != "" {
			// Write something, then wait to be SIGKILLed: the catalog is
			// left as a crashed writer leaves it.
			if err := c.Update(context.Background(), func(tx *Tx) error {
				return tx.PutBlob(nthID(7), BlobLocation{Pack: delta.Hash([]byte("pack")), Type: delta.BlobData, Length: 1, RawLength: 1, Compression: 1})
			}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		os.Stdout.WriteString("ready\n")
		io.Copy(io.Discard, os.Stdin)
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestLockedByOtherProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		stdin.Close()
		cmd.Wait()
		t.Fatalf("helper: %q %v", line, err)
	}
	_, err = Open(context.Background(), dir, Options{})
	checkInUse(t, err, dir)
	stdin.Close()
	go io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	openAt(t, dir) // the lock died with the holder
}

// Something other than turnsnap holding Badger's own directory lock is
// reported the same way, not as Badger's raw error.
func TestLockedByForeignBadger(t *testing.T) {
	dir := t.TempDir()
	db, err := badger.Open(badgerOptions(dir, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = Open(context.Background(), dir, Options{})
	checkInUse(t, err, dir)
	// An empty log beside a live foreign Badger may be its memtable of an
	// instant ago: it is not ours to remove (removeEmptyLogs).
	mem := filepath.Join(dir, "00099.mem")
	if err := os.WriteFile(mem, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		_, err = Open(context.Background(), dir, Options{ReadOnly: ro})
		checkInUse(t, err, dir)
		if _, err := os.Stat(mem); err != nil {
			t.Fatalf("read-only %v: the empty memtable beside a foreign Badger: %v", ro, err)
		}
	}
}

// A writer SIGKILLed mid-session must not stop read-only commands (log,
// status) from opening the catalog: before the fix, Badger refused the
// read-only open with "Log truncate required" until a writing command ran.
func TestReadOnlyOpenAfterKilledWriter(t *testing.T) {
	dir := t.TempDir()
	killedWriter(t, dir)
	c, err := Open(context.Background(), dir, Options{ReadOnly: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("read-only open after a killed writer: %v", err)
	}
	defer c.Close()
	view(t, c, func(tx *Tx) error {
		if _, ok, err := tx.Blob(nthID(7)); !ok || err != nil {
			t.Errorf("the killed writer's committed blob: found %v, %v", ok, err)
		}
		return nil
	})
}

// killedWriter leaves the catalog in dir as a writer SIGKILLed mid-session
// leaves it, blob nthID(7) committed: a write-ahead memtable with one
// transaction, preallocated far past it, and a value log never trimmed.
func killedWriter(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+dir, helperWriteEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %q %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
}
