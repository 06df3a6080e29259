package fleethost

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

// TurnsnapBin returns the turnsnap binary the hosts run: TURNSNAP_BIN when
// `make test` has built one, else one built here into t's temp dir.
func TurnsnapBin(t testing.TB) string {
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

// Host is one member of the fleet: a home, its daemon, run in its own
// network namespace.
type Host struct {
	I      int
	Name   string // h1 ...
	Home   string
	HomeID string // set by whoever initialises the home
	Bin    string
	Net    *Net
	Env    []string
	Log    string         // the daemon's stderr, appended across restarts
	C      *client.Client // the daemon's API over its unix socket
	// ServeArgs are added to `turnsnap serve`'s arguments at each start
	// (--listen, --kube-node ...).
	ServeArgs []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// up is closed while the daemon answers; kill replaces it, so the
	// host's worker waits out a restart instead of failing its whole share
	// of operations in the milliseconds the daemon is gone.
	up chan struct{}
}

// NewHost makes host i (1-based) of fn under dir: its home is
// dir/hI/home, its daemon's log dir/hI/daemon.log. The daemon is stopped
// when t ends. With fn nil the host runs in the root network namespace.
func NewHost(t testing.TB, fn *Net, i int, bin, dir string, env []string) *Host {
	h := &Host{I: i, Name: fmt.Sprintf("h%d", i), Home: filepath.Join(dir, fmt.Sprintf("h%d", i), "home"),
		Bin: bin, Net: fn, Env: env, Log: filepath.Join(dir, fmt.Sprintf("h%d", i), "daemon.log")}
	if err := os.MkdirAll(filepath.Dir(h.Home), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Socket: filepath.Join(h.Home, "turnsnap.sock")})
	if err != nil {
		t.Fatal(err)
	}
	h.C = c
	h.up = make(chan struct{})
	t.Cleanup(func() { h.Stop() })
	return h
}

// Dir is the host's own directory (its home's parent): files a test gives
// the host (token, certificate, kubeconfig) go there.
func (h *Host) Dir() string { return filepath.Dir(h.Home) }

// WaitUp waits until the daemon answers, or d passes.
func (h *Host) WaitUp(d time.Duration) {
	h.mu.Lock()
	up := h.up
	h.mu.Unlock()
	select {
	case <-up:
	case <-time.After(d):
	}
}

// CLI runs turnsnap as a client (or directly on the home when no daemon
// answers) inside the host's namespace, with --json; it returns stdout and
// an error carrying stderr and the exit code.
func (h *Host) CLI(ctx context.Context, args ...string) ([]byte, error) {
	argv := h.Net.InNS(h.I, append([]string{h.Bin, "--home", h.Home, "--lock-wait", "20s", "--json"}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), h.Env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s: turnsnap %s: %w: %s", h.Name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// CLIJSON is CLI decoding stdout into v.
func (h *Host) CLIJSON(ctx context.Context, v any, args ...string) error {
	out, err := h.CLI(ctx, args...)
	if err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%s: turnsnap %s: decoding %q: %w", h.Name, strings.Join(args, " "), out, err)
	}
	return nil
}

// Help returns `turnsnap ARGS --help`, for the capability probes.
func (h *Host) Help(args ...string) string {
	out, _ := exec.Command(h.Bin, append(args, "--help")...).CombinedOutput()
	return string(out)
}

// Start starts the daemon and waits until it answers on its socket.
func (h *Host) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(h.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== fleet: start %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	argv := h.Net.InNS(h.I, append([]string{h.Bin, "--home", h.Home, "--lock-wait", "60s", "serve", "--log-format", "text"}, h.ServeArgs...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), h.Env...)
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
		err := h.C.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-done:
			return fmt.Errorf("%s: turnsnap serve exited at start (%v); see %s", h.Name, cmd.ProcessState, h.Log)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s: turnsnap serve does not answer: %v; see %s", h.Name, err, h.Log)
		}
		time.Sleep(50 * time.Millisecond) // polling the socket: the daemon has no readiness signal
	}
	h.cmd, h.done = cmd, done
	close(h.up)
	return nil
}

// Running says whether the daemon was started and not stopped or killed
// since.
func (h *Host) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cmd != nil
}

// detach takes the running daemon's process from h (nil if none), so that
// callers wait for h.up until the next start.
func (h *Host) detach() (*exec.Cmd, chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cmd, done := h.cmd, h.done
	h.cmd = nil
	if cmd != nil {
		h.up = make(chan struct{})
	}
	return cmd, done
}

// Kill SIGKILLs the daemon and waits for it to be gone.
func (h *Host) Kill() bool {
	cmd, done := h.detach()
	if cmd == nil {
		return false
	}
	cmd.Process.Kill()
	<-done
	return true
}

// Stop sends SIGTERM (a daemon releases what it holds) and waits, killing
// it after a minute.
func (h *Host) Stop() error {
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
		return errors.New(h.Name + ": turnsnap serve did not stop on SIGTERM within a minute")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("%s: turnsnap serve exited %d on SIGTERM; see %s", h.Name, code, h.Log)
	}
	return nil
}

// LogTail is the end of the daemon's log, for failure messages.
func (h *Host) LogTail(n int) string {
	b, _ := os.ReadFile(h.Log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// UnmountUnder detaches every mount below dir, deepest first: daemons leave
// their sandboxes mounted when they stop (by design), and t.TempDir's
// removal cannot pass a mount.
func UnmountUnder(t testing.TB, dir string) {
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

// InitRemote points the host's home at the bucket remote (s3://BUCKET) on
// endpoint, running `turnsnap init` inside the host's namespace as its
// daemon will reach the bucket, and sets h.HomeID from the home's config.
func (h *Host) InitRemote(ctx context.Context, remote, endpoint string) error {
	if _, err := h.CLI(ctx, "init", "--remote", remote, "--endpoint", endpoint, "--insecure"); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(h.Home, "config.json"))
	if err != nil {
		return err
	}
	var cfg struct {
		HomeID string `json:"home_id"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: config.json: %w", h.Name, err)
	}
	if cfg.HomeID == "" {
		return fmt.Errorf("%s: config.json has no home_id after init: %s", h.Name, b)
	}
	h.HomeID = cfg.HomeID
	return nil
}
