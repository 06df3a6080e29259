// Package demo is the scripted agent session `turnsnap demo` runs: a
// multi-turn session on a temporary home that prints what each turn cost.
// It is a walkthrough, not a benchmark (package bench holds those).
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/turnsnap/turnsnap/bench"
	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/proc"
)

// Options configures Run.
type Options struct {
	// Dir holds the demo's home and base; empty means a new temporary
	// directory, removed afterwards unless Keep is set.
	Dir  string
	Keep bool
	Out  io.Writer
}

// Turn is one row of the demo's table.
type Turn struct {
	Sandbox  string        `json:"sandbox"`
	Turn     int           `json:"turn"`
	Action   string        `json:"action"`
	Class    delta.Class   `json:"class"`
	ID       string        `json:"id"`
	BytesNew int64         `json:"bytes_new"`
	Objects  int64         `json:"objects_new"`
	Read     int64         `json:"files_read"`
	Duration time.Duration `json:"-"` // duration_ms in JSON (MarshalJSON)
}

// Report is what the demo did and measured.
type Report struct {
	Home        string        `json:"home"`
	Turns       []Turn        `json:"turns"`
	Rollback    time.Duration `json:"-"` // rollback_ms
	Branch      time.Duration `json:"-"` // branch_ms
	Verified    int           `json:"-"` // checkpoints_verified
	DiffChanges int           `json:"diff_changes"`
	// ServerAnswers is what the dev server said after the rollback ("" when
	// this host cannot run processes).
	ServerAnswers string `json:"server_after_rollback,omitempty"`
}

type step struct {
	action string
	do     func(root string) error
	// exec, if set, runs instead of do: a turn that starts processes.
	exec []string
}

// Run runs a scripted multi-turn agent session in an overlay sandbox:
// edits, a no-op turn, a temp file, deleting a base file, installing many
// small files, a failed destructive edit that is rolled back, a branch, and
// a verify of every checkpoint. It checks its own results and fails loudly
// if a rollback or branch does not give back the expected files.
func Run(ctx context.Context, opts Options) (*Report, error) {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	dir := opts.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "turnsnap-demo-"); err != nil {
			return nil, err
		}
	}
	rep := &Report{Home: filepath.Join(dir, "home")}
	base := filepath.Join(dir, "base")
	if err := bench.WriteProject(base, 7); err != nil {
		return nil, err
	}
	e, err := engine.Open(ctx, engine.Options{Home: rep.Home})
	if err != nil {
		return nil, err
	}
	defer func() {
		if !opts.Keep {
			for _, name := range []delta.SandboxName{"agent", "agent-alt"} {
				e.RemoveSandbox(context.WithoutCancel(ctx), name)
			}
		}
		e.Close()
		if !opts.Keep && opts.Dir == "" {
			os.RemoveAll(dir)
		}
	}()
	fmt.Fprintf(out, "turnsnap demo: home %s\n\n", rep.Home)
	cr, err := e.CreateSandbox(ctx, "agent", engine.CreateOptions{Base: base})
	if err != nil {
		return nil, err
	}
	rep.Turns = append(rep.Turns, Turn{Sandbox: "agent", Turn: 0, Action: fmt.Sprintf("create sandbox from base (%d entries)", cr.BaseStats.Entries),
		Class: cr.Checkpoint.Class, ID: cr.Checkpoint.ID.Short(), BytesNew: cr.Checkpoint.Stats.BytesNew,
		Objects: cr.Checkpoint.Stats.ObjectsNew, Read: cr.BaseStats.FilesRead, Duration: cr.Duration})
	root := cr.Root
	procs := processesAvailable()
	server := step{action: "start a dev server in the background (httpd)",
		exec: []string{"httpd", "-f", "-p", "8080", "-h", "/www"}}
	if !procs {
		server = step{action: "(no runc/CRIU here: dev-server turn skipped; `make demo` installs them)",
			do: func(string) error { return nil }}
	}
	steps := []step{
		{action: "edit src/main.go, add src/feature.go", do: func(r string) error {
			if err := appendFile(filepath.Join(r, "src/main.go"), "\nfunc feature() { run() }\n"); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(r, "src/feature.go"), []byte("package main\n\nfunc run() {}\n"), 0o644)
		}},
		{action: "read files only (cat, grep)", do: func(r string) error {
			_, err := os.ReadFile(filepath.Join(r, "src/main.go"))
			return err
		}},
		{action: "write and delete a temp file in /tmp", do: func(r string) error {
			p := filepath.Join(r, "tmp/build.log")
			if err := os.WriteFile(p, []byte("scratch output\n"), 0o644); err != nil {
				return err
			}
			return os.Remove(p)
		}},
		server,
		{action: "delete a base file (data/config.json)", do: func(r string) error {
			return os.Remove(filepath.Join(r, "data/config.json"))
		}},
		{action: "install dependencies (300 small files)", do: func(r string) error {
			return writeFiles(filepath.Join(r, "vendor"), 300, 2048, 11)
		}},
		{action: "failed destructive edit: rm -rf src/, clobber README", do: func(r string) error {
			if err := os.RemoveAll(filepath.Join(r, "src")); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(r, "README.md"), []byte("oops\n"), 0o644)
		}},
	}
	byTurn := map[int]catalog.CheckpointRef{}
	for i, s := range steps {
		if err := turn(ctx, e, rep, "agent", root, i+1, s, byTurn); err != nil {
			return nil, err
		}
	}
	// The agent's tests fail after turn 7: roll back to turn 6.
	rb, err := e.Rollback(ctx, "agent", byTurn[6], engine.RollbackOptions{})
	if err != nil {
		return nil, err
	}
	rep.Rollback = rb.Duration
	if err := expectFile(root, "src/main.go", "func feature() { run() }"); err != nil {
		return nil, fmt.Errorf("demo: after rollback: %w", err)
	}
	if procs {
		// The dev server of turn 4 is back, from its memory image.
		if rep.ServerAnswers, err = serverAnswers(ctx, e, "agent"); err != nil {
			return nil, fmt.Errorf("demo: dev server after rollback: %w", err)
		}
	}
	if err := turn(ctx, e, rep, "agent", root, 8, step{action: "retry: a careful edit of src/util.go", do: func(r string) error {
		return appendFile(filepath.Join(r, "src/util.go"), "\n// handles the empty case\n")
	}}, byTurn); err != nil {
		return nil, err
	}
	br, err := e.Branch(ctx, byTurn[5], "agent-alt", engine.BranchOptions{})
	if err != nil {
		return nil, err
	}
	rep.Branch = br.Duration
	if _, err := os.Stat(filepath.Join(br.Root, "vendor")); !os.IsNotExist(err) {
		return nil, fmt.Errorf("demo: branch of turn 5 has turn 6's vendor/ (%v)", err)
	}
	if err := turn(ctx, e, rep, "agent-alt", br.Root, 6, step{action: "branch: try another approach", do: func(r string) error {
		return os.WriteFile(filepath.Join(r, "src/experiment.go"), []byte("package main\n"), 0o644)
	}}, map[int]catalog.CheckpointRef{}); err != nil {
		return nil, err
	}
	for _, t := range rep.Turns {
		if t.Class == delta.ClassSkip {
			continue
		}
		ref, err := catalog.ParseCheckpointRef(t.ID)
		if err != nil {
			return nil, err
		}
		if _, err := e.Verifier().Verify(ctx, ref); err != nil {
			return nil, fmt.Errorf("demo: verify: %w", err)
		}
		rep.Verified++
	}
	first, err := catalog.ParseCheckpointRef(rep.Turns[0].ID)
	if err != nil {
		return nil, err
	}
	d, err := e.History().Diff(ctx, "agent", first, catalog.CheckpointRef{})
	if err != nil {
		return nil, err
	}
	rep.DiffChanges = len(d.Changes)
	printDemo(out, rep, d.Changes)
	return rep, nil
}

func turn(ctx context.Context, e *engine.Engine, rep *Report, name delta.SandboxName, root string, n int, s step, byTurn map[int]catalog.CheckpointRef) error {
	var err error
	if s.exec != nil {
		_, err = e.Processes().Exec(ctx, name, s.exec, engine.ExecOptions{Detach: true})
		time.Sleep(200 * time.Millisecond) // let it come up, as an agent would wait
	} else {
		err = s.do(root)
	}
	if err != nil {
		return fmt.Errorf("demo turn %d (%s): %w", n, s.action, err)
	}
	r, err := e.Checkpoint(ctx, name, engine.CheckpointOptions{Turn: &n, Message: s.action})
	if err != nil {
		return err
	}
	byTurn[n] = catalog.IDRef(r.ID)
	rep.Turns = append(rep.Turns, Turn{Sandbox: string(name), Turn: n, Action: s.action, Class: r.Class, ID: r.ID.Short(),
		BytesNew: r.Stats.BytesNew, Objects: r.Stats.ObjectsNew, Read: r.Stats.FilesRead, Duration: r.Duration})
	return nil
}

func printDemo(w io.Writer, rep *Report, changes []delta.Change) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sandbox\tturn\t action\tclass\tnew bytes\tobjects\tfiles read\ttime\t")
	var bytes, objects int64
	classes := map[delta.Class]int{}
	for _, t := range rep.Turns {
		fmt.Fprintf(tw, "%s\t%d\t %-52s\t%s\t%s\t%d\t%d\t%s\t\n", t.Sandbox, t.Turn, t.Action, t.Class,
			humanBytes(t.BytesNew), t.Objects, t.Read, humanDur(t.Duration))
		bytes += t.BytesNew
		objects += t.Objects
		classes[t.Class]++
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d turn boundaries: %d skip (no bytes written), %d fs, %d process, %d full; %s stored in %d objects\n",
		len(rep.Turns), classes[delta.ClassSkip], classes[delta.ClassFS], classes[delta.ClassProcess],
		classes[delta.ClassFull], humanBytes(bytes), objects)
	fmt.Fprintf(w, "rollback agent -> turn 6 after the failed edit: %s (restored layer re-hashed and matched; receipt ok)\n", humanDur(rep.Rollback))
	if rep.ServerAnswers != "" {
		fmt.Fprintf(w, "dev server from turn 4 restored from its CRIU image; it answers: %q\n", rep.ServerAnswers)
	}
	fmt.Fprintf(w, "branch turn 5 -> agent-alt: %s\n", humanDur(rep.Branch))
	fmt.Fprintf(w, "verify: %d checkpoints, every object and hash ok\n", rep.Verified)
	fmt.Fprintf(w, "diff agent turn 0 -> live root: %d paths changed\n", len(changes))
	for i, c := range changes {
		if i == 8 {
			fmt.Fprintf(w, "  ... and %d more\n", len(changes)-8)
			break
		}
		fmt.Fprintf(w, "  %c /%s\n", c.Kind, c.Path)
	}
}

func appendFile(p, s string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func expectFile(root, rel, substr string) error {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), substr) {
		return fmt.Errorf("%s lacks %q", rel, substr)
	}
	return nil
}

// writeFiles creates n files of about size bytes each under dir, spread over
// subdirectories of 50, with content that compresses like source code.
func writeFiles(dir string, n, size int, seed int64) error {
	rng := rand.New(rand.NewSource(seed))
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%03d", i/50), fmt.Sprintf("f%05d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, bench.TextLike(rng, size), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// processesAvailable reports whether this host can run sandbox processes:
// runc, the CRIU prefix and busybox for the demo's image.
func processesAvailable() bool {
	if _, err := exec.LookPath("runc"); err != nil {
		return false
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		return false
	}
	_, err := os.Stat("/bin/busybox")
	return err == nil
}

// serverAnswers fetches the demo's page from inside the sandbox.
func serverAnswers(ctx context.Context, e *engine.Engine, sandbox delta.SandboxName) (string, error) {
	var out strings.Builder
	code, err := e.Processes().Exec(ctx, sandbox, []string{"wget", "-q", "-O", "-", "http://127.0.0.1:8080/"}, engine.ExecOptions{Stdout: &out})
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("wget exited %d", code)
	}
	return strings.TrimSpace(out.String()), nil
}

func humanBytes(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }

func humanDur(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	}
	return d.Round(10 * time.Millisecond).String()
}

// MarshalJSON writes durations as every turnsnap command does:
// duration_ms, a float of milliseconds.
func (t Turn) MarshalJSON() ([]byte, error) {
	type plain Turn
	return json.Marshal(struct {
		plain
		Duration float64 `json:"duration_ms"`
	}{plain(t), ms(t.Duration)})
}

// MarshalJSON writes durations in milliseconds (see Turn.MarshalJSON).
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return json.Marshal(struct {
		plain
		Rollback float64 `json:"rollback_ms"`
		Branch   float64 `json:"branch_ms"`
		Verified int     `json:"checkpoints_verified"`
	}{plain(r), ms(r.Rollback), ms(r.Branch), r.Verified})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
