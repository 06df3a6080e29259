// Package harness replays traces (package bench/trace) against a real
// `turnsnap serve`, driven over its socket with the Go client as a
// platform would, side by side with the baselines: no checkpointing, a full
// checkpoint per turn (tar+zstd of the root plus a CRIU dump when
// processes run), chat-only and chat+filesystem recovery. It injects a
// crash per trace and seed (SIGKILL of the sandbox's processes and of the
// daemon), recovers with each method, finishes the trace and runs its
// verifier. docs/BENCH.md says what each figure means.
package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/proc"
)

// The methods, in report order.
const (
	FaultFree   = "fault_free"
	Turnsnap    = "turnsnap"
	FullPerTurn = "full_per_turn"
	ChatOnly    = "chat_only"
	ChatFS      = "chat_fs"
)

// Methods lists every method.
var Methods = []string{Turnsnap, FullPerTurn, ChatOnly, ChatFS, FaultFree}

// Config is one benchmark run.
type Config struct {
	// Home is the turnsnap home the daemon serves; Work holds bases and
	// the full-per-turn archives. Both are made if missing.
	Home, Work string
	// Daemon returns the command that runs `turnsnap --home HOME serve`
	// in the foreground (the harness starts, SIGKILLs and restarts it).
	Daemon func(home string) *exec.Cmd
	// Seeds per trace (>= 1).
	Seeds int
	// Colocate lists the N of the co-location runs (nil: none).
	Colocate []int
	// ColocationOnly skips the single-sandbox runs with crashes.
	ColocationOnly bool
	// CrashTurn, if set, picks the crash turn (1-based) of a trace and
	// seed; by default it is a random turn from 2 on, drawn from the seed.
	CrashTurn func(turns int, firstStart int, seed int) int
	// LatencyScale multiplies every turn's declared model latency (0: 1).
	// The checkpoint of a turn overlaps the (scaled) latency, so a small
	// scale is the pessimistic case for the methods that checkpoint.
	LatencyScale float64
	// MinIO, if set, is a MinIO server binary: the bench runs it on
	// 127.0.0.1 as the home's remote, so the daemon's background pusher
	// uploads while the traces replay and bytes_uploaded is measured.
	MinIO string
	// Cache is $TURNSNAP_CACHE, where the named base images are built
	// (scripts/deps.d/75-debian-image.sh); empty: $TURNSNAP_CACHE, else
	// /var/cache/turnsnap.
	Cache string
	// Progress, if set, hears each step.
	Progress func(Step)
	Log      *slog.Logger
}

// Step is one finished piece of work, for a progress display.
type Step struct {
	Done, Total int
	What        string
}

// Harness owns one daemon on one home.
type Harness struct {
	cfg  Config
	mu   sync.Mutex
	d    *daemon
	c    *client.Client
	rt   *proc.Runtime
	done int
	tot  int
	// minio is the remote (nil: none); uploadBase sums the upload
	// counters of the daemons the crashes killed.
	minio      *minio
	uploadBase int64
}

// New starts the daemon.
func New(ctx context.Context, cfg Config) (*Harness, error) {
	if cfg.Seeds < 1 {
		cfg.Seeds = 1
	}
	if cfg.LatencyScale <= 0 {
		cfg.LatencyScale = 1
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Cache == "" {
		cfg.Cache = DefaultCache()
	}
	var err error
	if cfg.Home, err = filepath.Abs(cfg.Home); err != nil {
		return nil, err
	}
	if cfg.Work, err = filepath.Abs(cfg.Work); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.Home, cfg.Work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	h := &Harness{cfg: cfg}
	if h.c, err = client.New(client.Options{Socket: filepath.Join(cfg.Home, "turnsnap.sock")}); err != nil {
		return nil, err
	}
	if cfg.MinIO != "" {
		if h.minio, err = startMinIO(ctx, cfg.MinIO, filepath.Join(cfg.Work, "minio")); err != nil {
			return nil, err
		}
	}
	if err := h.startDaemon(ctx); err != nil {
		h.minio.stop()
		return nil, err
	}
	if h.minio != nil {
		if err := h.initRemote(ctx); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// DefaultCache is $TURNSNAP_CACHE, else /var/cache/turnsnap.
func DefaultCache() string {
	if c := os.Getenv("TURNSNAP_CACHE"); c != "" {
		return c
	}
	return "/var/cache/turnsnap"
}

// Remote says whether the bench uploads to a MinIO remote.
func (h *Harness) Remote() bool { return h.minio != nil }

// Close stops the daemon (SIGTERM).
func (h *Harness) Close() error {
	defer h.minio.stop()
	if h.d == nil {
		return nil
	}
	return h.d.stop()
}

// runtime is a process runtime on the daemon's own runc state root: the
// harness uses it to kill a sandbox's processes (the crash) and for the
// full-per-turn baseline's CRIU dumps and restores.
func (h *Harness) runtime(ctx context.Context) (*proc.Runtime, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rt != nil {
		return h.rt, nil
	}
	rt, err := proc.New(ctx, proc.Config{StateRoot: filepath.Join("/run/turnsnap", scope(h.cfg.Home)), Logger: h.cfg.Log})
	if err != nil {
		return nil, err
	}
	h.rt = rt
	return rt, nil
}

// scope and containerID repeat engine's naming of a home's containers
// (engine/procs/procs.go): the baselines reach the container the daemon
// runs, which the API does not expose.
func scope(home string) string {
	sum := sha256.Sum256([]byte(home))
	return hex.EncodeToString(sum[:6])
}

func (h *Harness) containerID(sandbox string) string {
	return "ts-" + scope(h.cfg.Home) + "-" + sandbox
}

func (h *Harness) step(what string) {
	h.mu.Lock()
	h.done++
	s := Step{Done: h.done, Total: h.tot, What: what}
	h.mu.Unlock()
	if h.cfg.Progress != nil {
		h.cfg.Progress(s)
	}
}

// daemon is one `turnsnap serve` process.
type daemon struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func (h *Harness) startDaemon(ctx context.Context) error {
	cmd := h.cfg.Daemon(h.cfg.Home)
	if h.minio != nil {
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, h.minio.env()...)
	}
	log, err := os.OpenFile(filepath.Join(h.cfg.Work, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start turnsnap serve: %w", err)
	}
	d := &daemon{cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); log.Close(); close(d.exited) }()
	h.d = d
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := h.c.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-d.exited:
			return fmt.Errorf("turnsnap serve exited at start (see %s)", filepath.Join(h.cfg.Work, "daemon.log"))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("turnsnap serve does not answer: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *daemon) stop() error {
	select {
	case <-d.exited:
		return nil
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(time.Minute):
		d.cmd.Process.Kill()
		<-d.exited
		return errors.New("turnsnap serve did not stop on SIGTERM; killed")
	}
}

// crash is the injected fault: SIGKILL of every process of the sandbox
// (its container's init, which takes the pid namespace with it) and of the
// daemon, then a new daemon on the same home.
func (h *Harness) crash(ctx context.Context, sandbox string) error {
	rt, err := h.runtime(ctx)
	if err != nil {
		return err
	}
	if st, err := rt.State(ctx, h.containerID(sandbox)); err == nil && st.InitPID > 0 {
		if err := syscall.Kill(st.InitPID, syscall.SIGKILL); err != nil {
			return fmt.Errorf("sandbox %s: kill its init %d: %w", sandbox, st.InitPID, err)
		}
	}
	// The killed daemon's upload counter dies with it: keep what it
	// counted (an upload finishing between this read and the kill goes
	// uncounted).
	if h.minio != nil {
		if n, err := h.daemonUploaded(ctx); err == nil {
			h.mu.Lock()
			h.uploadBase += n
			h.mu.Unlock()
		}
	}
	h.mu.Lock()
	d := h.d
	h.mu.Unlock()
	d.cmd.Process.Kill()
	<-d.exited
	return h.startDaemon(ctx)
}
