package lazy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"golang.org/x/sys/unix"
)

// TestKillMidFetchRecovers kills (SIGKILL) a process in the middle of a
// fetch-ahead, with fills in flight, and checks what it left: a root whose
// state file says incomplete, files filled before the kill whole, the
// others still marked; Recover then finishes it, every file reads back the
// stored bytes through an overlay mount, and the layer scans to its tree.
func TestKillMidFetchRecovers(t *testing.T) {
	srv, b, src, tree, l := storedSample(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v")
	cmd.Env = append(os.Environ(), "LAZY_CHILD_ENDPOINT="+srv.Endpoint, "LAZY_CHILD_DIR="+l.dir, "LAZY_CHILD_TREE="+tree.String())
	out, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "ready" {
	}
	// Wait until some files are filled, then kill with fills in flight.
	deadline := time.Now().Add(30 * time.Second)
	for unmarked(t, l.upper) < 8 {
		if time.Now().After(deadline) {
			t.Fatal("the child filled nothing in 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	filledBefore := unmarked(t, l.upper)
	st, err := ReadState(l.dir)
	must(t, err)
	if !st.Incomplete || !st.Ready || st.Tree != tree {
		t.Fatalf("after the kill: state %+v, want incomplete and ready", st)
	}
	if filledBefore >= 46 {
		t.Fatalf("the child filled all %d files before the kill; the test kills nothing midway", filledBefore)
	}
	f, err := Recover(context.Background(), l.config(b, delta.ID{}))
	must(t, err)
	defer f.Close()
	if got := f.Stats().Pending; got != int64(46-filledBefore) {
		t.Errorf("recovery marked %d files, want the %d still marked", got, 46-filledBefore)
	}
	l.mount(t)
	must(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		got, err := os.ReadFile(filepath.Join(l.mnt, rel))
		if err != nil {
			return err
		}
		if w, _ := os.ReadFile(p); !bytes.Equal(got, w) {
			return fmt.Errorf("/%s after recovery: wrong bytes", rel)
		}
		return nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must(t, f.Wait(ctx))
	must(t, unix.Unmount(l.mnt, 0))
	sameTree(t, l.upper, tree)
	t.Logf("killed with %d of 46 files filled; recovery filled the rest", filledBefore)
}

// unmarked counts the regular files of upper that no longer carry the
// placeholder marker.
func unmarked(t testing.TB, upper string) int {
	t.Helper()
	n := 0
	buf := make([]byte, 4096)
	must(t, filepath.WalkDir(upper, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if _, err := unix.Lgetxattr(p, MarkerXattr, buf); err == unix.ENODATA && !strings.HasSuffix(p, "config.link") {
			n++ // a hardlink pair is one file: its second name is not counted
		}
		return nil
	}))
	return n
}

// TestKillChild is the process TestKillMidFetchRecovers kills: it restores
// the layer and fetches ahead, slowly (each chunk delayed), until killed.
func TestKillChild(t *testing.T) {
	endpoint := os.Getenv("LAZY_CHILD_ENDPOINT")
	if endpoint == "" {
		t.Skip("the child of TestKillMidFetchRecovers")
	}
	tree, err := delta.ParseID(os.Getenv("LAZY_CHILD_TREE"))
	must(t, err)
	b, err := bucketFromEnv(context.Background(), endpoint)
	must(t, err)
	b.delay = 20 * time.Millisecond
	dir := os.Getenv("LAZY_CHILD_DIR")
	l := layout{dir: dir, upper: filepath.Join(dir, "upper")}
	cfg := l.config(b, tree)
	cfg.Keeper = os.Getenv("LAZY_CHILD_KEEPER") != ""
	f, err := Restore(context.Background(), cfg)
	must(t, err)
	fmt.Println("ready")
	if cfg.Keeper {
		select {} // answer what comes, fetch nothing ahead, until killed
	}
	_ = f.FetchAhead(context.Background(), nil)
	t.Fatal("the child finished before it was killed")
}

// TestKeeperHoldsAccessesWhileNoListenerRuns: with a keeper, an access to a
// placeholder made while the listener is dead (SIGKILL) waits instead of
// reading holes; the next process takes the group back from the keeper,
// and once the layer is whole the waiting access reads the stored bytes.
// The keeper is gone after the Close.
func TestKeeperHoldsAccessesWhileNoListenerRuns(t *testing.T) {
	srv, b, src, tree, l := storedSample(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v")
	cmd.Env = append(os.Environ(), "LAZY_CHILD_ENDPOINT="+srv.Endpoint, "LAZY_CHILD_DIR="+l.dir, "LAZY_CHILD_TREE="+tree.String(), "LAZY_CHILD_KEEPER=1")
	out, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "ready" {
	}
	l.mount(t)
	// The child answers nothing (it fetches nothing ahead and is killed
	// before the reader starts): the read waits on the kept group.
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	st, err := ReadState(l.dir)
	must(t, err)
	if st.Keeper == 0 {
		t.Fatal("no keeper recorded in the state file")
	}
	reader := exec.Command("cat", filepath.Join(l.mnt, "src/mod03.py"))
	var got bytes.Buffer
	reader.Stdout = &got
	must(t, reader.Start())
	exited := make(chan error, 1)
	go func() { exited <- reader.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the read finished with no listener running (%v): %q", err, got.String())
	case <-time.After(700 * time.Millisecond):
	}
	cfg := l.config(b, delta.ID{})
	cfg.Keeper = true
	f, err := Recover(context.Background(), cfg)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must(t, f.FetchAhead(ctx, nil))
	must(t, f.Close())
	select {
	case err := <-exited:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting read did not finish after the layer was whole")
	}
	want, _ := os.ReadFile(filepath.Join(src, "src/mod03.py"))
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("the read that waited got %d bytes, not the stored %d", got.Len(), len(want))
	}
	// Gone, or a zombie its new parent has not reaped yet.
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", st.Keeper)); err == nil {
		if _, rest, _ := strings.Cut(string(stat), ") "); !strings.HasPrefix(rest, "Z") {
			t.Errorf("keeper %d still runs after the Close: %s", st.Keeper, stat)
		}
	}
}
