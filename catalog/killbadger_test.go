package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/killpoint"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"golang.org/x/sys/unix"
)

// A turnsnap killed at any point of Badger's open, commit or close leaves a
// catalog the next command opens, read-only (`turnsnap log`) or writable,
// with everything committed before the kill (issue 23: a kill at the unlink
// of a flushed NNNNN.mem, or at a .vlog step, left a catalog every
// read-only command and the first writer failed on).
//
// The kills are real and land at exact points: the session (see session)
// runs under ptrace (killpoint.Run), which SIGKILLs it at the entry of a
// system call that changes a file in the catalog directory (create,
// truncate, write, allocate, map, sync, unlink, rename), at each such call
// the session makes. Each state is then opened both ways, on two
// copies: read-only first and then writable, and writable first.
func TestKilledInsideBadger(t *testing.T) {
	if raceEnabled {
		// Some ninety sessions and five hundred opens of instrumented
		// binaries, for no data race: make test's plain run covers it.
		t.Skip("crash states, not races: covered by the run without -race")
	}
	// The session starts by recovering a crashed writer's catalog.
	template := filepath.Join(t.TempDir(), "template")
	if err := os.Mkdir(template, 0o700); err != nil {
		t.Fatal(err)
	}
	killedWriter(t, template)
	run := func(t *testing.T, kill func(call string) bool) (dir string, calls []string, committed []int) {
		t.Helper()
		dir = filepath.Join(t.TempDir(), "catalog")
		if err := copyDirSparse(template, dir); err != nil {
			t.Fatal(err)
		}
		out, err := os.CreateTemp(t.TempDir(), "committed")
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		calls, err = killpoint.Run(context.Background(), []string{os.Args[0]}, []string{sessionEnv + "=" + dir},
			[]*os.File{nil, out, os.Stderr}, dir, kill)
		if errors.Is(err, killpoint.ErrUnsupported) {
			testenv.Missing(t, "ptrace and seccomp", err.Error())
		}
		if err != nil {
			t.Fatal(err)
		}
		committed = []int{7} // the killed writer's
		b, _ := io.ReadAll(io.NewSectionReader(out, 0, 1<<20))
		for _, f := range strings.Fields(string(b)) {
			i, _ := strconv.Atoi(f)
			committed = append(committed, i)
		}
		return dir, calls, committed
	}
	// A run to the end lists the calls to kill at. Which thread makes a call
	// first varies from run to run (Badger flushes in the background), so a
	// kill point is "the k-th call like this one", not "the n-th call".
	_, calls, committed := run(t, func(string) bool { return false })
	if len(committed) != 1+2*sessionBlobs {
		t.Fatalf("the session ran to its end but reported %v committed", committed)
	}
	seen := map[string]int{}
	for n, call := range calls {
		seen[call]++
		k := seen[call]
		t.Run(fmt.Sprintf("%03d %s #%d", n+1, call, k), func(t *testing.T) {
			count := 0
			dir, _, committed := run(t, func(c string) bool {
				if c == call {
					count++
				}
				return count == k
			})
			if count < k {
				t.Logf("this run made %q only %d times: not killed", call, count)
				return
			}
			rw := filepath.Join(t.TempDir(), "catalog")
			if err := copyDirSparse(dir, rw); err != nil {
				t.Fatal(err)
			}
			checkRecovered(t, dir, true, committed)
			checkRecovered(t, rw, false, committed)
		})
	}
	t.Logf("%d kill points: %s", len(calls), strings.Join(calls, "; "))
	// The states the issue names must be among them, or the test proves
	// nothing about them: a flushed memtable truncated to zero but not yet
	// unlinked, and a value log created but not yet sized.
	for _, want := range [][2]string{{"unlink ", ".mem"}, {"ftruncate ", ".vlog to 134217728"}} {
		found := false
		for _, s := range calls {
			found = found || strings.HasPrefix(s, want[0]) && strings.HasSuffix(s, want[1])
		}
		if !found {
			t.Errorf("no kill at %s...%s", want[0], want[1])
		}
	}
}

// copyDirSparse copies the regular files of src into a new directory dst,
// keeping their holes: Badger's logs are sparse files of 32 and 128 MiB
// holding a few KB.
func copyDirSparse(src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFileSparse(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func copyFileSparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	defer out.Close()
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	return out.Close()
}
