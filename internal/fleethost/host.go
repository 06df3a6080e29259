package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/client"
)

// turnsnapBin returns the turnsnap binary the hosts run: TURNSNAP_BIN when
// `make test` has built one, else one built here into t's temp dir.
func turnsnapBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TURNSNAP_BIN"); b != "" {
		if _, err := os.Stat(b); err == nil {
			return b
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "turnsnap")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/turnsnap/turnsnap/cmd/turnsnap")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building turnsnap: %v\n%s", err, out)
	}
	return bin
}

// host is one member of the fleet: a home, its daemon, run in its own
// network namespace.
type host struct {
	i      int
	name   string // h1 ...
	home   string
	homeID string
	bin    string
	net    *fleetNet
	env    []string
	log    string // the daemon's stderr, appended across restarts
	c      *client.Client

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// up is closed while the daemon answers; kill replaces it, so the
	// host's worker waits out a restart instead of failing its whole share
	// of operations in the milliseconds the daemon is gone.
	up chan struct{}
}

func newHost(t *testing.T, fn *fleetNet, i int, bin, dir string, env []string) *host {
	h := &host{i: i, name: fmt.Sprintf("h%d", i), home: filepath.Join(dir, fmt.Sprintf("h%d", i), "home"),
		bin: bin, net: fn, env: env, log: filepath.Join(dir, fmt.Sprintf("h%d", i), "daemon.log")}
	if err := os.MkdirAll(filepath.Dir(h.home), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Socket: filepath.Join(h.home, "turnsnap.sock")})
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	h.up = make(chan struct{})
	t.Cleanup(func() { h.stop() })
	return h
}

// waitUp waits until the daemon answers, or d passes.
func (h *host) waitUp(d time.Duration) {
	h.mu.Lock()
	up := h.up
	h.mu.Unlock()
	select {
	case <-up:
	case <-time.After(d):
	}
}

// cli runs turnsnap as a client (or directly on the home when no daemon
// answers) inside the host's namespace, with --json; it returns stdout and
// an error carrying stderr and the exit code.
func (h *host) cli(ctx context.Context, args ...string) ([]byte, error) {
	argv := h.net.inNS(h.i, append([]string{h.bin, "--home", h.home, "--lock-wait", "20s", "--json"}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), h.env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s: turnsnap %s: %w: %s", h.name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// cliJSON is cli decoding stdout into v.
func (h *host) cliJSON(ctx context.Context, v any, args ...string) error {
	out, err := h.cli(ctx, args...)
	if err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%s: turnsnap %s: decoding %q: %w", h.name, strings.Join(args, " "), out, err)
	}
	return nil
}

// help returns `turnsnap ARGS --help`, for the capability probes.
func (h *host) help(args ...string) string {
	out, _ := exec.Command(h.bin, append(args, "--help")...).CombinedOutput()
	return string(out)
}

// start starts the daemon and waits until it answers on its socket.
func (h *host) start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(h.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== fleet: start %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	argv := h.net.inNS(h.i, h.bin, "--home", h.home, "--lock-wait", "60s", "serve", "--log-format", "text")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), h.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The daemon must not outlive the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := h.c.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-done:
			return fmt.Errorf("%s: turnsnap serve exited at start (%v); see %s", h.name, cmd.ProcessState, h.log)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s: turnsnap serve does not answer: %v; see %s", h.name, err, h.log)
		}
		time.Sleep(50 * time.Millisecond) // polling the socket: the daemon has no readiness signal
	}
	h.cmd, h.done = cmd, done
	close(h.up)
	return nil
}

// detach takes the running daemon's process from h (nil if none), so that
// callers wait for h.up until the next start.
func (h *host) detach() (*exec.Cmd, chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cmd, done := h.cmd, h.done
	h.cmd = nil
	if cmd != nil {
		h.up = make(chan struct{})
	}
	return cmd, done
}

// kill SIGKILLs the daemon and waits for it to be gone.
func (h *host) kill() bool {
	cmd, done := h.detach()
	if cmd == nil {
		return false
	}
	cmd.Process.Kill()
	<-done
	return true
}

// stop sends SIGTERM (a daemon releases what it holds) and waits, killing
// it after a minute.
func (h *host) stop() error {
	cmd, done := h.detach()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		return errors.New(h.name + ": turnsnap serve did not stop on SIGTERM within a minute")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("%s: turnsnap serve exited %d on SIGTERM; see %s", h.name, code, h.log)
	}
	return nil
}

// logTail is the end of the daemon's log, for failure messages.
func (h *host) logTail(n int) string {
	b, _ := os.ReadFile(h.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// unmountUnder detaches every mount below dir, deepest first: daemons leave
// their sandboxes mounted when they stop (by design), and t.TempDir's
// removal cannot pass a mount.
func unmountUnder(t *testing.T, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// Mount points escape blanks as octal; the test's paths have none.
		if p := f[4]; p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			t.Logf("fleet cleanup: unmounting %s: %v", p, err)
		}
	}
}
