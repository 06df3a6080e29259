package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Neutral is a session recorded outside the project, in the neutral form
// of docs/BENCH.md: base files at absolute paths, commands run with
// /bin/sh in a working directory, detached starts, the model latency
// before each turn, a verifier and an end probe. FromNeutral turns it
// into a v2 trace.
type Neutral struct {
	Name        string        `json:"name"`
	Description string        `json:"description,omitempty"`
	Image       *Image        `json:"image,omitempty"`
	Files       []NeutralFile `json:"files,omitempty"`
	Cwd         string        `json:"cwd,omitempty"`
	Turns       []NeutralTurn `json:"turns"`
	Verifier    NeutralCmd    `json:"verifier"`
	EndProbe    *NeutralCmd   `json:"end_probe,omitempty"`
}

// NeutralFile is a base file at an absolute path.
type NeutralFile struct {
	Path       string `json:"path"`
	Content    string `json:"content,omitempty"`
	ContentB64 string `json:"content_b64,omitempty"`
	Mode       string `json:"mode,omitempty"`
}

// NeutralTurn is one model call (its latency comes first) and the
// actions it produced.
type NeutralTurn struct {
	LatencyMS int             `json:"latency_ms"`
	Actions   []NeutralAction `json:"actions"`
}

// NeutralAction is exactly one of Run (a command, waited for), Start (a
// detached command, named Name or p1, p2, ... in start order) and Stop
// (the name of a started one).
type NeutralAction struct {
	Run       string `json:"run,omitempty"`
	Start     string `json:"start,omitempty"`
	Name      string `json:"name,omitempty"`
	Stop      string `json:"stop,omitempty"`
	Cwd       string `json:"cwd,omitempty"`
	TimeoutMS int    `json:"timeout_ms,omitempty"`
}

// NeutralCmd is the verifier or the end probe.
type NeutralCmd struct {
	Run       string `json:"run"`
	Cwd       string `json:"cwd,omitempty"`
	TimeoutMS int    `json:"timeout_ms,omitempty"`
}

// FromNeutral converts a neutral-form session into a checked v2 trace.
// The latency before turn i+1 becomes the latency that closes turn i (the
// same model call, seen from the turn it follows); the latency before the
// first turn precedes any work, so no checkpoint can overlap it, and is
// dropped; the last turn closes with no model call.
func FromNeutral(b []byte) (*Trace, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("neutral trace: %d bytes, more than %d: %w", len(b), MaxFileBytes, errdefs.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var n Neutral
	if err := dec.Decode(&n); err != nil {
		return nil, fmt.Errorf("neutral trace: %v: %w", err, errdefs.ErrInvalid)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("neutral trace %s: data after the object: %w", n.Name, errdefs.ErrInvalid)
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("neutral trace %s: %s: %w", n.Name, fmt.Sprintf(format, a...), errdefs.ErrInvalid)
	}
	t := &Trace{Version: 2, Name: n.Name, Description: n.Description, Cwd: n.Cwd,
		Verify: Command{Cmd: n.Verifier.Run, Cwd: n.Verifier.Cwd, TimeoutMS: n.Verifier.TimeoutMS}}
	t.Base.Image = n.Image
	if n.EndProbe != nil {
		t.Probe = &Command{Cmd: n.EndProbe.Run, Cwd: n.EndProbe.Cwd, TimeoutMS: n.EndProbe.TimeoutMS}
	}
	for _, f := range n.Files {
		if !strings.HasPrefix(f.Path, "/") {
			return nil, bad("file %q: not an absolute path", f.Path)
		}
		t.Base.Files = append(t.Base.Files, File{Path: strings.TrimPrefix(f.Path, "/"), Content: f.Content, ContentB64: f.ContentB64, Mode: f.Mode})
	}
	if len(n.Turns) > MaxTurns {
		return nil, bad("%d turns, at most %d", len(n.Turns), MaxTurns)
	}
	starts := 0
	for i, nt := range n.Turns {
		var turn Turn
		if nt.LatencyMS < 0 || int64(nt.LatencyMS) > MaxLatency.Milliseconds() {
			return nil, bad("turn %d: latency %d ms not between 0 and %v", i+1, nt.LatencyMS, MaxLatency)
		}
		if i+1 < len(n.Turns) {
			turn.ModelLatencyMS = n.Turns[i+1].LatencyMS
		}
		if len(nt.Actions) > MaxCmdsPerTurn {
			return nil, bad("turn %d: %d actions, at most %d", i+1, len(nt.Actions), MaxCmdsPerTurn)
		}
		for j, a := range nt.Actions {
			switch {
			case a.Run != "" && a.Start == "" && a.Stop == "" && a.Name == "":
				turn.Steps = append(turn.Steps, Step{Cmd: a.Run, Cwd: a.Cwd, TimeoutMS: a.TimeoutMS})
			case a.Start != "" && a.Run == "" && a.Stop == "" && a.TimeoutMS == 0:
				starts++
				name := a.Name
				if name == "" {
					name = fmt.Sprintf("p%d", starts)
				}
				turn.Steps = append(turn.Steps, Step{Start: &Process{Name: name, Cmd: a.Start, Cwd: a.Cwd}})
			case a.Stop != "" && a.Run == "" && a.Start == "" && a.Name == "" && a.Cwd == "" && a.TimeoutMS == 0:
				turn.Steps = append(turn.Steps, Step{Stop: a.Stop})
			default:
				return nil, bad("turn %d action %d: exactly one of run, start (with name), stop", i+1, j+1)
			}
		}
		t.Turns = append(t.Turns, turn)
	}
	if err := t.Check(); err != nil {
		return nil, err
	}
	return t, nil
}
