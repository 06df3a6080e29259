// Package trace is the replayed-trace format of `turnsnap bench`
// (docs/BENCH.md): a task (a base tree and a verifier) and the turns an
// agent took on it. The loader is strict: unknown fields, trailing data,
// unsafe paths and anything over its bound are errors, so a trace written
// by someone else either runs as written or is refused with a reason.
package trace

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Bounds of one trace. They are generous for a hand-written or recorded
// session and small enough that a hostile file cannot exhaust memory.
const (
	MaxFileBytes    = 4 << 20 // one trace file
	MaxTurns        = 1000
	MaxCmdsPerTurn  = 64
	MaxCmdBytes     = 16 << 10
	MaxBaseFiles    = 10000
	MaxBaseBytes    = 2 << 20 // inline content, all files together
	MaxProcesses    = 16      // started over the whole trace
	MaxTimeout      = 10 * time.Minute
	MaxLatency      = time.Minute
	DefaultTimeout  = time.Minute
	DefaultVerifyTO = 30 * time.Second
)

// Trace is one task and its turns.
type Trace struct {
	// Version is the format: 0 or 1 (v1), or 2. The v2 fields (Cwd,
	// Probe, a turn's Steps, a file's ContentB64, a command's Cwd) are
	// refused in a v1 trace, and v1's per-turn cmds/start/stop in a v2
	// one, so that neither is read as the other.
	Version     int    `json:"version,omitempty"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Base        Base   `json:"base"`
	// Verify exits 0 when the task is done (run after the last turn).
	Verify Command `json:"verify"`
	// Cwd (v2) is the working directory of every command, start, probe
	// and the verifier that does not name its own (default /).
	Cwd string `json:"cwd,omitempty"`
	// Probe (v2) runs after the last turn, before the verifier; a
	// recovered run's output and exit code must equal the fault-free
	// run's (end_probe_match in the report).
	Probe *Command `json:"probe,omitempty"`
	// Seeds (v2) caps how many of the bench's seeds replay the trace (0:
	// all): a trace on a large image costs several times a small one's
	// runs, and one crash point keeps `make bench` in its time.
	Seeds int    `json:"seeds,omitempty"`
	Turns []Turn `json:"turns"`
	// src is the directory of the file Load read the trace from: a
	// relative image dir is resolved against it.
	src string
}

// ImageDir is the host directory of the base image (empty without one or
// with another kind of image).
func (t *Trace) ImageDir() string {
	if t.Base.Image == nil {
		return ""
	}
	return t.hostPath(t.Base.Image.Dir)
}

// ImageOCI is the host directory of the base's OCI image layout (empty
// without one).
func (t *Trace) ImageOCI() string {
	if t.Base.Image == nil {
		return ""
	}
	return t.hostPath(t.Base.Image.OCI)
}

// ImageTar is the host file of the base's tarball (empty without one).
func (t *Trace) ImageTar() string {
	if t.Base.Image == nil {
		return ""
	}
	return t.hostPath(t.Base.Image.Tar)
}

// hostPath resolves a path of the trace against its file's directory.
func (t *Trace) hostPath(p string) string {
	if p == "" {
		return ""
	}
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(t.src, filepath.FromSlash(p))
}

// Base is the tree the sandbox starts from, besides the busybox rootfs the
// harness always provides (/bin/busybox and its applets, /proc, /dev, /sys,
// /tmp).
type Base struct {
	// Image (v2) replaces the busybox rootfs: the files and dirs are
	// written on top of a copy of it.
	Image *Image   `json:"image,omitempty"`
	Files []File   `json:"files,omitempty"`
	Dirs  []string `json:"dirs,omitempty"`
	// Generate (v2) writes generated trees (a vendored-dependency tree of
	// thousands of files) on top of the image, before Files and Dirs:
	// a large base without its files in the repository.
	Generate []Generator `json:"generate,omitempty"`
}

// Image is a rootfs a v2 trace starts from: exactly one of Dir, a host
// directory; OCI, an OCI image layout (index.json, blobs/sha256/...) whose
// layers are applied in order; Tar, a tarball (.tar, .tar.gz, .tar.zst)
// of a root; and Name, an image the harness builds and caches
// (docs/BENCH.md lists them). Relative paths are the trace file's
// directory's.
type Image struct {
	Dir  string `json:"dir,omitempty"`
	OCI  string `json:"oci,omitempty"`
	Tar  string `json:"tar,omitempty"`
	Name string `json:"name,omitempty"`
}

// File is one base file; Mode is octal text ("0755"), default 0644.
// Content is UTF-8 text; ContentB64 (v2, instead of Content) is any bytes,
// standard base64.
type File struct {
	Path       string `json:"path"`
	Content    string `json:"content,omitempty"`
	ContentB64 string `json:"content_b64,omitempty"`
	Mode       string `json:"mode,omitempty"`
}

// Data is the file's content.
func (f File) Data() ([]byte, error) {
	if f.ContentB64 != "" {
		return base64.StdEncoding.DecodeString(f.ContentB64)
	}
	return []byte(f.Content), nil
}

// Command is a shell command (sh -c) with a timeout and (v2) a working
// directory.
type Command struct {
	Cmd       string `json:"cmd"`
	TimeoutMS int    `json:"timeout_ms,omitempty"`
	Cwd       string `json:"cwd,omitempty"`
}

// Turn is what the agent did between two model calls.
type Turn struct {
	Note string `json:"note,omitempty"`
	// Cmds run one after another; their exit codes are recorded, never
	// fatal (an agent's test run fails on purpose).
	Cmds      []string `json:"cmds,omitempty"`
	TimeoutMS int      `json:"timeout_ms,omitempty"` // each command's
	// ModelLatencyMS is the model's think time after the turn.
	ModelLatencyMS int `json:"model_latency_ms,omitempty"`
	// Start starts long-lived processes (after Cmds); Stop kills running
	// ones by name (before Cmds).
	Start []Process `json:"start,omitempty"`
	Stop  []string  `json:"stop,omitempty"`
	// Steps (v2) are the turn's work in the order it runs: each one
	// command, one start or one stop.
	Steps []Step `json:"steps,omitempty"`
}

// Step is one thing a v2 turn does: exactly one of Cmd, Start, Stop.
type Step struct {
	Cmd       string   `json:"cmd,omitempty"`
	Cwd       string   `json:"cwd,omitempty"`
	TimeoutMS int      `json:"timeout_ms,omitempty"` // Cmd's; else the turn's
	Start     *Process `json:"start,omitempty"`
	Stop      string   `json:"stop,omitempty"`
}

// Plan is the turn's steps in the order they run. A v1 turn's are its
// stops, then its commands, then its starts (the order v1 always ran
// them in); a v2 turn's are its Steps as written.
func (t Turn) Plan() []Step {
	if len(t.Steps) > 0 {
		out := make([]Step, len(t.Steps))
		for i, s := range t.Steps {
			if s.Cmd != "" && s.TimeoutMS == 0 {
				s.TimeoutMS = t.TimeoutMS
			}
			out[i] = s
		}
		return out
	}
	var out []Step
	for _, s := range t.Stop {
		out = append(out, Step{Stop: s})
	}
	for _, c := range t.Cmds {
		out = append(out, Step{Cmd: c, TimeoutMS: t.TimeoutMS})
	}
	for i := range t.Start {
		out = append(out, Step{Start: &t.Start[i]})
	}
	return out
}

// StartsProcess says whether the turn starts a process.
func (t Turn) StartsProcess() bool {
	for _, s := range t.Plan() {
		if s.Start != nil {
			return true
		}
	}
	return false
}

// SeedCount is how many seeds replay the trace when the bench runs n.
func (t *Trace) SeedCount(n int) int {
	if t.Seeds > 0 && t.Seeds < n {
		return t.Seeds
	}
	return n
}

// Dir is the working directory of a command that names cwd (empty: the
// trace's, and the sandbox's default / without one).
func (t *Trace) Dir(cwd string) string {
	if cwd != "" {
		return cwd
	}
	return t.Cwd
}

// Process is a long-lived process the trace starts.
type Process struct {
	Name string `json:"name"`
	Cmd  string `json:"cmd"`
	Cwd  string `json:"cwd,omitempty"` // v2
	// Probe asks the running process for its state; its stdout must be the
	// same after a restore as at the checkpoint (state equivalence).
	Probe *Command `json:"probe,omitempty"`
}

// Timeout is the command's timeout (DefaultTimeout if unset).
func (c Command) Timeout(def time.Duration) time.Duration {
	if c.TimeoutMS == 0 {
		return def
	}
	return time.Duration(c.TimeoutMS) * time.Millisecond
}

// CmdTimeout is each of the turn's commands' timeout.
func (t Turn) CmdTimeout() time.Duration {
	return Command{TimeoutMS: t.TimeoutMS}.Timeout(DefaultTimeout)
}

// Latency is the turn's model latency.
func (t Turn) Latency() time.Duration { return time.Duration(t.ModelLatencyMS) * time.Millisecond }

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Parse decodes and checks one trace.
func Parse(b []byte) (*Trace, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("trace: %d bytes, more than %d: %w", len(b), MaxFileBytes, errdefs.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var t Trace
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("trace: %v: %w", err, errdefs.ErrInvalid)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("trace %s: data after the trace object: %w", t.Name, errdefs.ErrInvalid)
	}
	if err := t.Check(); err != nil {
		return nil, err
	}
	return &t, nil
}

// Check validates a decoded trace; errors name the trace and the turn.
func (t *Trace) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("trace %s: %s: %w", t.Name, fmt.Sprintf(format, a...), errdefs.ErrInvalid)
	}
	if t.Version < 0 || t.Version > 2 {
		return bad("version %d, want 1 or 2", t.Version)
	}
	v2 := t.Version == 2
	if !nameRE.MatchString(t.Name) {
		return bad("name must match %s", nameRE)
	}
	if len(t.Description) > MaxCmdBytes {
		return bad("description over %d bytes", MaxCmdBytes)
	}
	if !v2 && (t.Cwd != "" || t.Probe != nil || t.Seeds != 0) {
		return bad("cwd, probe and seeds need version 2")
	}
	if t.Seeds < 0 || t.Seeds > 1000 {
		return bad("seeds %d, want 0 to 1000", t.Seeds)
	}
	if err := checkDir(t.Cwd); err != nil {
		return bad("cwd: %v", err)
	}
	if t.Probe != nil {
		if err := checkCommand(*t.Probe, true, v2); err != nil {
			return bad("probe: %v", err)
		}
	}
	if img := t.Base.Image; img != nil {
		set := 0
		for _, p := range []string{img.Dir, img.OCI, img.Tar, img.Name} {
			if p != "" {
				set++
			}
			if len(p) > 1024 || strings.ContainsRune(p, 0) {
				return bad("base image path over 1024 bytes or with a NUL byte")
			}
		}
		switch {
		case !v2:
			return bad("base image needs version 2")
		case set != 1:
			return bad("base image: exactly one of dir, oci, tar and name")
		case img.Name != "" && !nameRE.MatchString(img.Name):
			return bad("base image name must match %s", nameRE)
		}
	}
	if len(t.Base.Generate) > 0 && !v2 {
		return bad("base generate needs version 2")
	}
	if err := checkGenerate(t.Base.Generate); err != nil {
		return bad("base generate: %v", err)
	}
	if len(t.Base.Files)+len(t.Base.Dirs) > MaxBaseFiles {
		return bad("base has more than %d entries", MaxBaseFiles)
	}
	total, seen := 0, map[string]bool{}
	for _, f := range t.Base.Files {
		if err := checkPath(f.Path); err != nil {
			return bad("base file %q: %v", f.Path, err)
		}
		if seen[f.Path] {
			return bad("base file %q given twice", f.Path)
		}
		seen[f.Path] = true
		if _, err := f.FileMode(); err != nil {
			return bad("base file %q: %v", f.Path, err)
		}
		n := len(f.Content)
		if f.ContentB64 != "" {
			if !v2 || f.Content != "" {
				return bad("base file %q: content_b64 needs version 2 and no content", f.Path)
			}
			// The decoded size is known before decoding: a bound checked
			// first, so a huge string is refused without its bytes.
			n = base64.StdEncoding.DecodedLen(len(f.ContentB64))
			if total+n <= MaxBaseBytes {
				d, err := f.Data()
				if err != nil {
					return bad("base file %q: content_b64: %v", f.Path, err)
				}
				n = len(d)
			}
		}
		if total += n; total > MaxBaseBytes {
			return bad("base content over %d bytes", MaxBaseBytes)
		}
	}
	for _, d := range t.Base.Dirs {
		if err := checkPath(d); err != nil {
			return bad("base dir %q: %v", d, err)
		}
	}
	if err := checkCommand(t.Verify, true, v2); err != nil {
		return bad("verify: %v", err)
	}
	if len(t.Turns) == 0 || len(t.Turns) > MaxTurns {
		return bad("%d turns, want 1 to %d", len(t.Turns), MaxTurns)
	}
	running, started := map[string]bool{}, 0
	for i, turn := range t.Turns {
		n := i + 1
		if len(turn.Note) > MaxCmdBytes {
			return bad("turn %d: note over %d bytes", n, MaxCmdBytes)
		}
		if turn.TimeoutMS < 0 || time.Duration(turn.TimeoutMS)*time.Millisecond > MaxTimeout {
			return bad("turn %d: timeout %d ms not between 0 and %v", n, turn.TimeoutMS, MaxTimeout)
		}
		if turn.ModelLatencyMS < 0 || turn.Latency() > MaxLatency {
			return bad("turn %d: model latency %d ms not between 0 and %v", n, turn.ModelLatencyMS, MaxLatency)
		}
		switch {
		case v2 && (len(turn.Cmds) > 0 || len(turn.Start) > 0 || len(turn.Stop) > 0):
			return bad("turn %d: a version 2 turn lists its work in steps (no cmds, start or stop)", n)
		case !v2 && len(turn.Steps) > 0:
			return bad("turn %d: steps need version 2", n)
		case len(turn.Cmds) > MaxCmdsPerTurn || len(turn.Steps) > MaxCmdsPerTurn:
			return bad("turn %d: more than %d commands or steps", n, MaxCmdsPerTurn)
		}
		for j, st := range turn.Steps {
			k := 0
			for _, set := range []bool{st.Cmd != "", st.Start != nil, st.Stop != ""} {
				if set {
					k++
				}
			}
			if k != 1 || (st.Cmd == "" && (st.Cwd != "" || st.TimeoutMS != 0)) {
				return bad("turn %d step %d: exactly one of cmd, start, stop (cwd and timeout_ms go with cmd)", n, j+1)
			}
		}
		for j, st := range turn.Plan() {
			switch {
			case st.Cmd != "":
				if err := checkCommand(Command{Cmd: st.Cmd, TimeoutMS: st.TimeoutMS, Cwd: st.Cwd}, true, v2); err != nil {
					return bad("turn %d step %d: %v", n, j+1, err)
				}
			case st.Stop != "":
				if !running[st.Stop] {
					return bad("turn %d: stops %q, which is not running", n, st.Stop)
				}
				delete(running, st.Stop)
			case st.Start != nil:
				p := st.Start
				if !nameRE.MatchString(p.Name) {
					return bad("turn %d: process name %q must match %s", n, p.Name, nameRE)
				}
				if running[p.Name] {
					return bad("turn %d: process %q is already running", n, p.Name)
				}
				if started++; started > MaxProcesses {
					return bad("more than %d process starts", MaxProcesses)
				}
				if err := checkCommand(Command{Cmd: p.Cmd, Cwd: p.Cwd}, true, v2); err != nil {
					return bad("turn %d: process %s: %v", n, p.Name, err)
				}
				if p.Probe != nil {
					if err := checkCommand(*p.Probe, true, v2); err != nil {
						return bad("turn %d: process %s: probe: %v", n, p.Name, err)
					}
				}
				running[p.Name] = true
			default: // a v1 empty command or stop name
				return bad("turn %d step %d: empty command", n, j+1)
			}
		}
	}
	return nil
}

// checkDir accepts "" or a clean absolute path.
func checkDir(d string) error {
	switch {
	case d == "":
		return nil
	case len(d) > 1024 || !strings.HasPrefix(d, "/") || path.Clean(d) != d || strings.ContainsRune(d, 0):
		return errors.New("not a clean absolute path of at most 1024 bytes")
	}
	return nil
}

func checkCommand(c Command, need, v2 bool) error {
	if c.Cwd != "" && !v2 {
		return errors.New("cwd needs version 2")
	}
	if err := checkDir(c.Cwd); err != nil {
		return fmt.Errorf("cwd: %w", err)
	}
	switch {
	case need && strings.TrimSpace(c.Cmd) == "":
		return errors.New("empty command")
	case len(c.Cmd) > MaxCmdBytes:
		return fmt.Errorf("command over %d bytes", MaxCmdBytes)
	case strings.ContainsRune(c.Cmd, 0):
		return errors.New("command contains a NUL byte")
	case c.TimeoutMS < 0 || time.Duration(c.TimeoutMS)*time.Millisecond > MaxTimeout:
		return fmt.Errorf("timeout %d ms not between 0 and %v", c.TimeoutMS, MaxTimeout)
	}
	return nil
}

// checkPath accepts a clean relative path that stays inside the base.
func checkPath(p string) error {
	switch {
	case p == "" || len(p) > 1024:
		return errors.New("empty or over 1024 bytes")
	case strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "." || strings.HasPrefix(p, "../") || p == "..":
		return errors.New("not a clean relative path inside the base")
	case strings.ContainsRune(p, 0):
		return errors.New("contains a NUL byte")
	}
	for _, top := range []string{"bin", "proc", "dev", "sys"} {
		if p == top || strings.HasPrefix(p, top+"/") {
			return fmt.Errorf("/%s belongs to the harness's rootfs", top)
		}
	}
	return nil
}

// FileMode parses Mode (default 0644); only permission bits.
func (f File) FileMode() (os.FileMode, error) {
	if f.Mode == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(f.Mode, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("mode %q is not octal permission bits", f.Mode)
	}
	return os.FileMode(m), nil
}

// Load reads one trace file.
func Load(file string) (*Trace, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", file, err)
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if t.src, err = filepath.Abs(filepath.Dir(file)); err != nil {
		return nil, err
	}
	return t, nil
}

// LoadDir reads every *.json of dir, sorted by name; names must be unique.
func LoadDir(dir string) ([]*Trace, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("traces %s: no *.json trace: %w", dir, errdefs.ErrNotFound)
	}
	var out []*Trace
	seen := map[string]string{}
	for _, f := range files {
		t, err := Load(f)
		if err != nil {
			return nil, err
		}
		if prev, ok := seen[t.Name]; ok {
			return nil, fmt.Errorf("traces %s: %s and %s are both named %s: %w", dir, prev, f, t.Name, errdefs.ErrInvalid)
		}
		seen[t.Name] = f
		out = append(out, t)
	}
	return out, nil
}

// WriteBase writes the trace's generated trees, then its base dirs and
// files, under dir. Every write goes through an os.Root: an image may hold
// symlinks (a hostile one, pointing out of the root), and a base file is
// never written through one outside dir.
func (t *Trace) WriteBase(dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, g := range t.Base.Generate {
		if _, err := g.Write(root); err != nil {
			return fmt.Errorf("trace %s: base generate %s in %s: %w", t.Name, g.Kind, g.Dir, err)
		}
	}
	for _, d := range t.Base.Dirs {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("trace %s: base dir %s: %w", t.Name, d, err)
		}
	}
	for _, f := range t.Base.Files {
		if d := path.Dir(f.Path); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("trace %s: base file %s: %w", t.Name, f.Path, err)
			}
		}
		mode, _ := f.FileMode()
		// A file of the image is replaced, not written through: the copy
		// of an image may share its bytes (reflinks, hard links).
		if err := root.Remove(f.Path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("trace %s: base file %s: %w", t.Name, f.Path, err)
		}
		data, err := f.Data()
		if err != nil {
			return fmt.Errorf("trace %s: base file %s: %w", t.Name, f.Path, err)
		}
		if err := root.WriteFile(f.Path, data, mode); err != nil {
			return fmt.Errorf("trace %s: base file %s: %w", t.Name, f.Path, err)
		}
		if err := root.Chmod(f.Path, mode); err != nil {
			return err
		}
	}
	return nil
}
