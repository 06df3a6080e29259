package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/bench/layers"
	"github.com/turnsnap/turnsnap/bench/trace"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Run is one trace replayed once with one method.
type Run struct {
	Trace  string `json:"trace"`
	Seed   int    `json:"seed"`
	Method string `json:"method"`
	// CrashTurn is the turn during which the crash came (0: none); the
	// trace resumed at that turn, the one after the last checkpoint.
	CrashTurn int  `json:"crash_turn"`
	Correct   bool `json:"correct"` // the verifier passed
	// StateEquivalent (turnsnap): the restored tree's digest equals the
	// digest at the checkpoint and every probe answered as it did then.
	StateEquivalent *bool   `json:"state_equivalent,omitempty"`
	Equivalence     string  `json:"equivalence,omitempty"` // why not, when not
	WallMS          float64 `json:"wall_ms"`               // end to end, recovery included
	// WorkMS is the replay's time without the crash and recovery: turns,
	// latencies and checkpoints (the figure overheads are computed from).
	WorkMS float64 `json:"work_ms"`
	// LatencyMS is the model latency the replay slept (scaled).
	LatencyMS float64 `json:"latency_ms"`
	// CkptMS is each checkpoint, start to commit; it runs during the
	// model latency (overlap.go).
	CkptMS []float64 `json:"ckpt_ms"`
	// ExposedMS is, per checkpoint, how long the gate held the next turn
	// beyond the model latency; Overlapped counts the checkpoints that
	// started before their model latency ended.
	ExposedMS  []float64 `json:"exposed_ms"`
	Overlapped int       `json:"overlapped"`
	// PauseMS is, per checkpoint that froze the processes, how long.
	PauseMS     []float64 `json:"pause_ms"`
	RestoreMS   float64   `json:"restore_ms"`
	BytesStored int64     `json:"bytes_stored"`
	// BytesUploaded is what the daemon's background pusher uploaded to
	// the MinIO remote during the run (-1: no remote).
	BytesUploaded int64          `json:"bytes_uploaded"`
	Classes       map[string]int `json:"classes,omitempty"`
	VerifyOut     string         `json:"verify_out,omitempty"`
	// EndProbe is the trace's end probe (v2), run after the last turn.
	EndProbe *ProbeResult `json:"end_probe,omitempty"`
	// Audit (turnsnap, first seed) is `turnsnap audit` of the sandbox
	// after its verifier; the report writes it as audit-TRACE.html.
	Audit *api.AuditReport `json:"-"`
	// End is when the run's time ended (its verifier done): a co-location
	// batch's wall time leaves the teardown out.
	End time.Time `json:"-"`
	Err string    `json:"error,omitempty"`
}

// ProbeResult is a command's exit code and output tail.
type ProbeResult struct {
	Code int    `json:"code"`
	Out  string `json:"out"`
}

// procState is the harness's view of the trace's running processes: name
// to pid in the sandbox (0: the agent thinks it runs, it does not).
type procState map[string]int

func (p procState) clone(zero bool) procState {
	out := procState{}
	for k, v := range p {
		if zero {
			v = 0
		}
		out[k] = v
	}
	return out
}

// crashTurn picks the turn a (trace, seed) crashes in.
func (h *Harness) crashTurn(t *trace.Trace, seed int) int {
	n, first := len(t.Turns), 0
	for i, turn := range t.Turns {
		if turn.StartsProcess() && first == 0 {
			first = i + 1
		}
	}
	if h.cfg.CrashTurn != nil {
		return h.cfg.CrashTurn(n, first, seed)
	}
	if n < 2 {
		return 1
	}
	rng := rand.New(rand.NewSource(int64(seed)*7919 + int64(len(t.Name))))
	return 2 + rng.Intn(n-1)
}

// base writes the sandbox base of t: a busybox rootfs, or a copy of the
// trace's image, and the trace's tree on top.
func (h *Harness) base(t *trace.Trace) (string, error) {
	dir := filepath.Join(h.cfg.Work, "bases", t.Name)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir, nil
	}
	os.RemoveAll(dir)
	var err error
	if t.Base.Image == nil {
		err = busyboxRootfs(dir)
	} else {
		err = h.imageRootfs(t, dir)
	}
	if err != nil {
		return "", err
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := t.WriteBase(dir); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644)
}

func busyboxRootfs(dir string) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox rootfs: %w (apt package busybox-static)", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bb, 0o755); err != nil {
		return err
	}
	list, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" || strings.ContainsAny(a, "/[") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	return nil
}

// imageVersion is the recipe version of a named image; it must match
// the script that builds it (scripts/deps.d/75-debian-image.sh).
func imageVersion(name string) (int, bool) {
	switch name {
	case "debian-bookworm":
		return 2, true
	}
	return 0, false
}

// ImagePath is where a named image's rootfs is cached.
func ImagePath(cache, name string) (string, error) {
	v, ok := imageVersion(name)
	if !ok {
		return "", fmt.Errorf("base image %q: no such named image (debian-bookworm is): %w", name, errdefs.ErrInvalid)
	}
	img := filepath.Join(cache, "images", fmt.Sprintf("%s-v%d", name, v))
	if _, err := os.Stat(filepath.Join(img, ".complete")); err != nil {
		return "", fmt.Errorf("base image %s is not built in %s (scripts/deps.sh debian-image builds it): %w", name, img, errdefs.ErrNotFound)
	}
	return filepath.Join(img, "rootfs"), nil
}

// imageRootfs copies the trace's image into dir: a copy, so that neither
// the trace's files nor the daemon ever write into the image.
func (h *Harness) imageRootfs(t *trace.Trace, dir string) error {
	if oci, tarball := t.ImageOCI(), t.ImageTar(); oci != "" || tarball != "" {
		return unpackImage(t, oci, tarball, dir)
	}
	src := t.ImageDir()
	if t.Base.Image.Name != "" {
		var err error
		if src, err = ImagePath(h.cfg.Cache, t.Base.Image.Name); err != nil {
			return fmt.Errorf("trace %s: %w", t.Name, err)
		}
	}
	if st, err := os.Stat(src); err != nil || !st.IsDir() {
		return fmt.Errorf("trace %s: base image dir %s is not a directory: %w", t.Name, src, errdefs.ErrNotFound)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	// cp -a keeps owners, modes, links, device nodes and xattrs; reflinks
	// where the filesystem has them.
	if out, err := exec.Command("cp", "-a", "--reflink=auto", "--", src, dir).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("trace %s: copy the base image %s: %v: %s", t.Name, src, err, out)
	}
	return nil
}

// sandboxName is unique per run.
func sandboxName(t *trace.Trace, method string, seed, slot int) string {
	short := map[string]string{FaultFree: "ff", Turnsnap: "ts", FullPerTurn: "full", ChatOnly: "chat", ChatFS: "chatfs"}[method]
	return fmt.Sprintf("%s-%s-%d-%d", t.Name, short, seed, slot)
}

// replay runs t with method. crash 0: no crash.
func (h *Harness) replay(ctx context.Context, t *trace.Trace, method string, seed, slot, crash int) (r *Run) {
	r = &Run{Trace: t.Name, Seed: seed, Method: method, CrashTurn: crash, Classes: map[string]int{}, BytesUploaded: -1}
	start := time.Now()
	// The run's time ends with its verifier (the audit, the upload drain
	// and the teardown are the harness's); recovery is the crash and its
	// recovery, aside the state snapshot the harness takes.
	var end time.Time
	var recovery, aside time.Duration
	defer func() {
		if end.IsZero() {
			end = time.Now()
		}
		r.End = end
		r.WallMS, r.WorkMS = ms(end.Sub(start)-aside), ms(end.Sub(start)-recovery-aside)
	}()
	// A main-matrix run (slot 0) runs alone: the uploads between its start
	// and its end, queue drained, are its own.
	var up0 int64
	if slot == 0 && h.minio != nil {
		up0 = h.uploaded(ctx)
	}
	fail := func(err error) *Run { r.Err = err.Error(); return r }
	base, err := h.base(t)
	if err != nil {
		return fail(err)
	}
	name := sandboxName(t, method, seed, slot)
	h.c.RemoveSandbox(ctx, name, false) // a leftover of an interrupted run
	created, err := h.c.CreateSandbox(ctx, api.CreateRequest{Name: name, Base: base})
	if err != nil {
		return fail(err)
	}
	defer h.c.RemoveSandbox(context.WithoutCancel(ctx), name, false)
	full := &fullCkpt{h: h, sandbox: name, dir: filepath.Join(h.cfg.Work, "full", name)}
	defer os.RemoveAll(full.dir)
	last := created.Checkpoint.String()
	procs, atCkpt := procState{}, procState{}
	var want *snapshot // turnsnap: the state at the last checkpoint before the crash
	for i := 1; i <= len(t.Turns); i++ {
		turn := t.Turns[i-1]
		if err := h.runTurn(ctx, name, t, turn, procs); err != nil {
			return fail(fmt.Errorf("turn %d: %w", i, err))
		}
		if i == crash && recovery == 0 {
			rs := time.Now()
			if err := h.crash(ctx, name); err != nil {
				return fail(fmt.Errorf("crash at turn %d: %w", i, err))
			}
			rt0 := time.Now()
			if err := h.recover(ctx, method, name, base, last, full); err != nil {
				return fail(fmt.Errorf("recover with %s after the crash at turn %d: %w", method, i, err))
			}
			r.RestoreMS = ms(time.Since(rt0))
			procs = atCkpt.clone(method == ChatOnly || method == ChatFS)
			if want != nil {
				ok, why := h.equivalent(ctx, name, want)
				r.StateEquivalent, r.Equivalence = &ok, why
			}
			i-- // the crashed turn's work is lost: it runs again
			recovery = time.Since(rs)
			continue
		}
		var ckpt func(context.Context) error
		switch method {
		case Turnsnap, ChatFS:
			ckpt = func(ctx context.Context) error {
				n := i
				cp, err := h.c.Checkpoint(ctx, name, api.CheckpointRequest{Turn: &n, Message: "turn " + strconv.Itoa(i)})
				if err != nil {
					return fmt.Errorf("checkpoint of turn %d: %w", i, err)
				}
				last = cp.ID.String()
				r.Classes[string(cp.Class)]++
				r.BytesStored += cp.BytesNew
				return nil
			}
		case FullPerTurn:
			withProcs := len(procs) > 0
			ckpt = func(ctx context.Context) error {
				n, pause, err := full.checkpoint(ctx, i, withProcs)
				if err != nil {
					return fmt.Errorf("full checkpoint of turn %d: %w", i, err)
				}
				r.BytesStored += n
				if pause > 0 {
					r.PauseMS = append(r.PauseMS, ms(pause))
				}
				return nil
			}
		}
		lat := time.Duration(float64(turn.Latency()) * h.cfg.LatencyScale)
		b, err := turnBoundary(ctx, lat, ckpt)
		if err != nil {
			return fail(err)
		}
		r.LatencyMS += ms(lat)
		if ckpt != nil {
			r.CkptMS = append(r.CkptMS, ms(b.Ckpt))
			r.ExposedMS = append(r.ExposedMS, ms(b.Exposed))
			if b.Overlapped {
				r.Overlapped++
			}
		}
		atCkpt = procs.clone(false)
		if method == Turnsnap && i == crash-1 && recovery == 0 {
			s0 := time.Now()
			if want, err = h.snapshot(ctx, name, t, procs); err != nil {
				return fail(fmt.Errorf("state at turn %d: %w", i, err))
			}
			aside += time.Since(s0)
		}
	}
	if t.Probe != nil {
		// The end probe runs before the verifier, which may change what
		// it reads; Summarise compares it with the fault-free run's.
		code, out, err := h.sh(ctx, name, inDir(t.Dir(t.Probe.Cwd), t.Probe.Cmd), t.Probe.Timeout(trace.DefaultVerifyTO))
		if err != nil {
			return fail(fmt.Errorf("end probe: %w", err))
		}
		r.EndProbe = &ProbeResult{Code: code, Out: out}
	}
	code, out, err := h.sh(ctx, name, inDir(t.Dir(t.Verify.Cwd), t.Verify.Cmd), t.Verify.Timeout(trace.DefaultVerifyTO))
	if err != nil {
		return fail(fmt.Errorf("verifier: %w", err))
	}
	r.Correct, r.VerifyOut = code == 0, out
	end = time.Now()
	if (method == Turnsnap || method == ChatFS) && slot == 0 {
		// The records keep each checkpoint's pause; the audit reads them
		// back. A failure to audit is logged, not the run's.
		a, err := h.c.Audit(ctx, name)
		if err != nil {
			h.cfg.Log.Warn("audit", "sandbox", name, "err", err)
		}
		for _, turn := range auditTurns(a) {
			if turn.PauseMS > 0 {
				r.PauseMS = append(r.PauseMS, turn.PauseMS)
			}
		}
		if method == Turnsnap && seed == 1 {
			r.Audit = a // the report writes it as audit-TRACE.html
		}
	}
	if slot == 0 && h.minio != nil {
		h.drain(ctx)
		r.BytesUploaded = h.uploaded(ctx) - up0
	}
	return r
}

func auditTurns(a *api.AuditReport) []api.AuditTurn {
	if a == nil {
		return nil
	}
	return a.Turns
}

// runTurn runs the turn's steps in order: stops, commands and starts.
// Command failures are the agent's (recorded by the verifier's outcome),
// not the harness's.
func (h *Harness) runTurn(ctx context.Context, name string, t *trace.Trace, turn trace.Turn, procs procState) error {
	for _, st := range turn.Plan() {
		switch {
		case st.Stop != "":
			if pid := procs[st.Stop]; pid > 0 {
				h.sh(ctx, name, fmt.Sprintf("kill %d; i=0; while kill -0 %d 2>/dev/null && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done", pid, pid), 30*time.Second)
			}
			delete(procs, st.Stop)
		case st.Cmd != "":
			if _, _, err := h.sh(ctx, name, inDir(t.Dir(st.Cwd), st.Cmd), trace.Command{TimeoutMS: st.TimeoutMS}.Timeout(trace.DefaultTimeout)); err != nil {
				return err
			}
		case st.Start != nil:
			p := st.Start
			ex, err := h.c.Exec(ctx, name, api.ExecRequest{Argv: []string{"sh", "-c", inDir(t.Dir(p.Cwd), p.Cmd)}, Detach: true}, api.Stdio{})
			if err != nil {
				return fmt.Errorf("start %s: %w", p.Name, err)
			}
			procs[p.Name] = ex.PID
		}
	}
	return nil
}

// inDir makes cmd run in dir (the exec API has no working directory). A
// missing dir fails the command, as it would the agent's; a multi-line
// cmd does not run its later lines elsewhere.
func inDir(dir, cmd string) string {
	if dir == "" {
		return cmd
	}
	return "cd -- '" + strings.ReplaceAll(dir, "'", `'\''`) + "' || exit 127\n" + cmd
}

// sh runs cmd in the sandbox, returning its exit code and the tail of its
// output. The timeout cancels the exec (the daemon sends the command
// SIGTERM) and counts as exit 124, the agent's failure like any other. It
// is not busybox timeout: its watchdog child outlives a quick command by up
// to a second and would show up as a new process in the next checkpoint.
func (h *Harness) sh(ctx context.Context, name, cmd string, timeout time.Duration) (int, string, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := &tail{max: 4096}
	ex, err := h.c.Exec(cctx, name, api.ExecRequest{Argv: []string{"sh", "-c", cmd}},
		api.Stdio{In: bytes.NewReader(nil), Out: out, Err: out})
	switch {
	case err != nil && ctx.Err() == nil && cctx.Err() != nil:
		return 124, string(out.b) + fmt.Sprintf("\n(timed out after %v)", timeout), nil
	case err != nil:
		return 0, "", fmt.Errorf("sandbox %s: %q: %w", name, cmd, err)
	}
	return ex.ExitCode, string(out.b), nil
}

// tail keeps the last max bytes written.
type tail struct {
	b   []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

var _ io.Writer = (*tail)(nil)

// recover brings the sandbox back after the crash, the method's way.
func (h *Harness) recover(ctx context.Context, method, name, base, last string, full *fullCkpt) error {
	switch method {
	case Turnsnap:
		_, err := h.c.Rollback(ctx, name, api.RollbackRequest{Checkpoint: last})
		return err
	case ChatFS:
		_, err := h.c.Rollback(ctx, name, api.RollbackRequest{Checkpoint: last, FSOnly: true})
		return err
	case ChatOnly:
		if _, err := h.c.RemoveSandbox(ctx, name, false); err != nil {
			return err
		}
		_, err := h.c.CreateSandbox(ctx, api.CreateRequest{Name: name, Base: base})
		return err
	case FullPerTurn:
		return full.restore(ctx)
	}
	return fmt.Errorf("method %s does not recover", method)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// unpackImage unpacks the trace's OCI layout or tarball into dir. Both
// are untrusted input: bench/layers bounds them and keeps every write in
// dir.
func unpackImage(t *trace.Trace, oci, tarball, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var err error
	if oci != "" {
		err = layers.UnpackOCI(context.Background(), oci, dir, layers.DefaultLimits)
	} else {
		err = layers.UnpackTar(context.Background(), tarball, dir, layers.DefaultLimits)
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("trace %s: base image: %w", t.Name, err)
	}
	return nil
}
