package proc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc/criu"
)

// DefaultCRIUFault is the value Config.CRIUFault takes when left empty.
//
// CRIU_FAULT=130 is CRIU's "no breakpoints" fault-injection switch
// (FI_NO_BREAKPOINTS). To take a dumped task back from its parasite code,
// CRIU normally stops it with a hardware breakpoint and waits for the trap;
// on VMs whose hypervisor does not deliver debug-register traps (this
// project's machines, verified with CRIU 4.1.1) the trap never comes and the
// dump hangs for ever at "Waiting for PID to trap". With 130, CRIU steps the
// task from syscall to syscall with ptrace instead (dump.log then shows
// "was trapped" once per step). That is correct on every host, costs a few
// more ptrace stops per task, and a host where breakpoints fail can only be
// told from one where they work by hanging, so it is the default
// everywhere. Set CRIUFault to CRIUFaultNone on hosts known to deliver
// hardware breakpoints.
const DefaultCRIUFault = "130"

// CRIUFaultNone as Config.CRIUFault leaves CRIU_FAULT unset.
const CRIUFaultNone = "none"

// Config says which binaries a Runtime drives and where it keeps state. The
// zero value of every field but StateRoot works.
type Config struct {
	// Runc is the runc binary; default "runc" from PATH (Debian 12's runc
	// 1.1.5 is what this package is tested with).
	Runc string
	// CRIU is the CRIU binary or wrapper; default DefaultCRIUPath(). It must
	// be CRIU >= 4.2 on kernels >= 6.16 (see docs/PROCESSES.md). Debian 12's
	// own /usr/sbin/criu (3.17) does not work on this kernel, which is why it
	// is always passed to runc explicitly.
	CRIU string
	// StateRoot holds runc's state (runc --root), the containers' bundles,
	// CRIU's configuration and work directories. Required; created if
	// missing. A tmpfs (under /run) suits it: runc's state does not survive
	// a reboot anyway.
	StateRoot string
	// CRIUFault is passed to CRIU as the CRIU_FAULT environment variable;
	// "" means DefaultCRIUFault, CRIUFaultNone leaves it unset.
	CRIUFault string
	// ProbeCache is a file that keeps the host probe's answers (runc and
	// CRIU versions, CRIU's features and check, the host facts) between
	// Runtimes, keyed by the binaries' identity and the kernel (see
	// probe.go); "" probes every time. A turnsnap home keeps one.
	ProbeCache string
	// NoKdatCache leaves CRIU's kernel-data cache alone (proc/criu/kdat.go):
	// every CRIU run then probes the kernel itself, as before the cache
	// (about 140 ms of every dump's pause here). For measuring the
	// difference.
	NoKdatCache bool
	// Logger receives debug lines about every runc and CRIU call; default
	// slog.Default().
	Logger *slog.Logger
}

// DefaultCRIUPath is where scripts/criu-install.sh puts its wrapper:
// $TURNSNAP_CACHE/criu/criu, or /var/cache/turnsnap/criu/criu.
func DefaultCRIUPath() string {
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = "/var/cache/turnsnap"
	}
	return filepath.Join(cache, "criu", "criu")
}

// Runtime drives runc and CRIU for one state root. It keeps no per-container
// state in memory (runc's state and the bundles on disk are the truth), so
// one Runtime is safe for concurrent use on different containers, and a new
// Runtime over the same StateRoot picks up the containers of an old one.
// Calls on one container must not overlap (the engine serialises a
// sandbox's turns).
type Runtime struct {
	cfg      Config
	scope    string // identity of the state root in cgroup paths
	log      *slog.Logger
	runcVer  string
	criuVer  criu.Version
	features criu.Features
	host     HostFacts
}

// New checks that runc and CRIU work and returns a Runtime. It runs
// `runc --version`, asks CRIU for its version (go-criu) and its features
// (CRIU's FEATURE_CHECK request), and runs `criu check`; a failure quotes
// the tool's own words. With Config.ProbeCache, a cached answer for the
// same binaries and kernel replaces all of that.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.StateRoot == "" {
		return nil, fmt.Errorf("proc: Config.StateRoot is required: %w", errdefs.ErrInvalid)
	}
	if cfg.Runc == "" {
		cfg.Runc = "runc"
	}
	if cfg.CRIU == "" {
		cfg.CRIU = DefaultCRIUPath()
	}
	if cfg.CRIUFault == "" {
		cfg.CRIUFault = DefaultCRIUFault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	root, err := filepath.Abs(cfg.StateRoot)
	if err != nil {
		return nil, fmt.Errorf("proc: state root %s: %w", cfg.StateRoot, err)
	}
	cfg.StateRoot = root
	for _, d := range []string{root, runcRoot(root), bundlesDir(root), workRoot(root), netnsDir(root)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("proc: state root: %w", err)
		}
	}
	sum := sha256.Sum256([]byte(root))
	r := &Runtime{cfg: cfg, scope: hex.EncodeToString(sum[:6]), log: cfg.Logger.With("component", "proc")}
	key := probeKey(cfg)
	res, cached := probeResult{}, false
	if cfg.ProbeCache != "" {
		res, cached = loadProbe(cfg.ProbeCache, key)
	}
	if !cached {
		if res, err = r.probe(ctx); err != nil {
			return nil, err
		}
		if cfg.ProbeCache != "" {
			if err := saveProbe(cfg.ProbeCache, key, res); err != nil {
				r.log.Warn("host probe not cached", "file", cfg.ProbeCache, "err", err)
			}
		}
	}
	r.runcVer, r.criuVer, r.features, r.host = res.Runc, res.CRIU, res.Features, res.Host
	if b, err := os.ReadFile(criuConfPath(root)); err != nil || string(b) != criu.Conf {
		if err := os.WriteFile(criuConfPath(root), []byte(criu.Conf), 0o600); err != nil {
			return nil, fmt.Errorf("proc: CRIU configuration: %w", err)
		}
	}
	if !cfg.NoKdatCache {
		if st, err := criu.EnsureKdat(ctx, cfg.CRIU, r.criuEnv()); err != nil {
			r.log.Warn("every CRIU run probes the kernel anew", "err", err)
		} else if st == criu.KdatMade {
			r.log.Debug("CRIU kernel-data cache made", "file", criu.KdatPath)
		}
	}
	r.log.Debug("runtime ready", "runc", r.runcVer, "criu", r.criuVer.String(),
		"mem_track", r.features.MemTrack, "lazy_pages", r.features.LazyPages)
	return r, nil
}

// probe asks runc and CRIU what they are and can do (see New).
func (r *Runtime) probe(ctx context.Context) (probeResult, error) {
	out, err := r.runc(ctx, nil, "--version")
	if err != nil {
		return probeResult{}, fmt.Errorf("proc: runc %s does not run: %w", r.cfg.Runc, err)
	}
	res := probeResult{Runc: strings.TrimPrefix(firstLine(out), "runc version ")}
	if res.CRIU, res.Features, err = criu.Probe(ctx, r.cfg.CRIU, r.criuEnv()); err != nil {
		return res, err
	}
	if res.Host, err = CurrentHost(); err != nil {
		return res, err
	}
	res.Host.CRIUVersion = res.CRIU
	return res, nil
}

// RuncVersion is what `runc --version` reported, e.g. "1.1.5+ds1".
func (r *Runtime) RuncVersion() string { return r.runcVer }

// CRIUVersion is the version CRIU reported through go-criu.
func (r *Runtime) CRIUVersion() criu.Version { return r.criuVer }

// Features are the optional CRIU features this host supports.
func (r *Runtime) Features() criu.Features { return r.features }

// Host is this host's facts, as recorded with every image it dumps.
func (r *Runtime) Host() HostFacts { return r.host }

// State root layout.
func runcRoot(root string) string          { return filepath.Join(root, "runc") }
func bundlesDir(root string) string        { return filepath.Join(root, "bundles") }
func workRoot(root string) string          { return filepath.Join(root, "work") }
func criuConfPath(root string) string      { return filepath.Join(root, "criu.conf") }
func (r *Runtime) bundle(id string) string { return filepath.Join(bundlesDir(r.cfg.StateRoot), id) }

// cgroupsPath is container id's cgroup, the same path under every
// controller: /turnsnap/SCOPE-ID, SCOPE naming the state root. Two state
// roots (two turnsnap homes) with a container of the same id thus never
// share a cgroup, so a pause of one never freezes the other and a dump of
// one never meets the other's processes. It is flat, one directory per
// container that runc removes with the container.
func (r *Runtime) cgroupsPath(id string) string { return "/turnsnap/" + r.scope + "-" + id }

// criuEnv is the environment runc passes on to CRIU: CRIU_FAULT (see
// DefaultCRIUFault) and CRIU_CONFIG_FILE (see criu.Conf).
func (r *Runtime) criuEnv() []string {
	env := os.Environ()
	if r.cfg.CRIUFault != CRIUFaultNone {
		env = append(env, "CRIU_FAULT="+r.cfg.CRIUFault)
	}
	return append(env, "CRIU_CONFIG_FILE="+criuConfPath(r.cfg.StateRoot))
}

// runc runs one runc command with the runtime's --root and --criu and
// returns its stdout. env nil means the caller's environment. A failure
// carries runc's own error message.
func (r *Runtime) runc(ctx context.Context, env []string, args ...string) ([]byte, error) {
	full := append([]string{"--root", runcRoot(r.cfg.StateRoot), "--criu", r.cfg.CRIU}, args...)
	cmd := exec.CommandContext(ctx, r.cfg.Runc, full...)
	cmd.Env = env
	var stdout bytes.Buffer
	var stderr capped
	cmd.Stdin = emptyReader{}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = stdioWait
	// runc dies with the turnsnap that runs it: an orphaned `runc
	// checkpoint` (and its CRIU) would go on freezing and dumping the
	// container after the next command found it thawed, and freeze that
	// command's exec with it. The signal is sent when the forking thread
	// ends, so the goroutine keeps its thread until runc has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err := cmd.Run()
	runtime.UnlockOSThread()
	r.log.Debug("runc", "args", args, "err", err)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("runc %s: %w", args[0], ctx.Err())
		}
		msg := runcMessage(stderr.Bytes(), err)
		if class := classify(stderr.Bytes()); class != nil {
			return stdout.Bytes(), fmt.Errorf("runc %s: %s: %w", args[0], msg, class)
		}
		return stdout.Bytes(), fmt.Errorf("runc %s: %s", args[0], msg)
	}
	return stdout.Bytes(), nil
}

// emptyReader makes exec.Cmd give a child a pipe that is at EOF at once,
// never the host's /dev/null: a container process holding a host file
// cannot be dumped.
type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, io.EOF }

var (
	runcMsgRe = regexp.MustCompile(`msg="((?:[^"\\]|\\.)*)"`)
	jsonMsgRe = regexp.MustCompile(`"msg":"((?:[^"\\]|\\.)*)"`)
)

// runcMessage extracts runc's error text from its logrus output.
func runcMessage(stderr []byte, err error) string {
	s := strings.TrimSpace(string(stderr))
	if m := runcMsgRe.FindAllStringSubmatch(s, -1); len(m) > 0 {
		parts := make([]string, 0, len(m))
		for _, x := range m {
			parts = append(parts, strings.ReplaceAll(x[1], `\n`, "; "))
		}
		return strings.Join(parts, "; ")
	}
	if s == "" {
		return err.Error()
	}
	return s
}

// classify maps runc's message to an error class, or nil when none fits.
func classify(stderr []byte) error {
	s := string(stderr)
	switch {
	case strings.Contains(s, "does not exist"), strings.Contains(s, "not found"):
		return errdefs.ErrNotFound
	case strings.Contains(s, "already exists"):
		return errdefs.ErrExists
	case strings.Contains(s, "not running"), strings.Contains(s, "is paused"),
		strings.Contains(s, "not paused"), strings.Contains(s, "cannot be checkpointed"):
		return errdefs.ErrPrecondition
	}
	return nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(s)
}

var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// checkID rejects ids runc would reject or that could escape the state root.
func checkID(id string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("container id %q: want letters, digits and _.- (at most 128): %w", id, errdefs.ErrInvalid)
	}
	return nil
}
