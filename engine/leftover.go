package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc"
)

// A create or branch makes the sandbox's root (HOME/sandboxes/NAME) before
// the catalog knows the sandbox: a turnsnap killed in between leaves a
// root, sometimes still mounted, that no catalog entry names. Before it
// makes any root it writes a creation marker naming the roots it is about
// to make and itself (its Holder); the catalog transaction that records
// the sandboxes is followed by the marker's removal. A root the catalog
// does not know, named by a marker whose holder is gone, is such a
// leftover: the next create or branch of that name, and `sandbox rm NAME`,
// remove it.
//
//	HOME/intents/PID.START-RANDOM.creating   JSON creatingMark

type creatingMark struct {
	Holder  string          `json:"holder"` // proc.Holder of the creating process
	Names   []string        `json:"names"`
	Backend string          `json:"backend"`
	Config  json.RawMessage `json:"config,omitempty"`
}

// markCreating writes the marker of a create or branch of names, durable
// before any root exists, and returns a function that removes it (call it
// once the catalog knows the sandboxes, or once the roots are undone).
func (e *Engine) markCreating(names []string, backend string, cfg json.RawMessage) (func(), error) {
	if err := ensureDir(e.home.intentsDir()); err != nil {
		return nil, err
	}
	m := creatingMark{Holder: proc.Self().String(), Names: names, Backend: backend, Config: cfg}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(e.home.intentsDir(), m.Holder+"-*.creating")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: creation marker: %w", names[0], err)
	}
	p := f.Name()
	f.Close()
	if err := writeDurable(p, string(body)); err != nil {
		os.Remove(p)
		return nil, fmt.Errorf("sandbox %s: creation marker: %w", names[0], err)
	}
	return func() { os.Remove(p) }, nil
}

// leftoverMark finds the marker of a create or branch of name whose
// process is gone (or is this one: its undo failed), and its file.
func (e *Engine) leftoverMark(name string) (*creatingMark, string) {
	files, _ := filepath.Glob(filepath.Join(e.home.intentsDir(), "*.creating"))
	self := proc.Self()
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var m creatingMark
		if err := json.Unmarshal(b, &m); err != nil {
			continue
		}
		if h, ok := proc.ParseHolder(m.Holder); ok && h.Alive() && h != self {
			continue // a create or branch in progress in another process
		}
		if slices.Contains(m.Names, name) {
			return &m, p
		}
	}
	return nil, ""
}

// removeLeftover removes the root of name that a killed create or branch
// left (m: its marker, nil: unknown, removed as an overlay root), and
// drops name from the marker.
func (e *Engine) removeLeftover(ctx context.Context, name string, m *creatingMark, markFile string) error {
	backend := defaultBackend
	var cfg json.RawMessage
	if m != nil {
		backend, cfg = m.Backend, m.Config
	}
	be, err := e.backend(backend, cfg)
	if err != nil {
		return fmt.Errorf("sandbox %s: leftover root: %w", name, err)
	}
	if err := be.Open(e.home.sandboxDir(name), "").Remove(ctx); err != nil {
		return fmt.Errorf("sandbox %s: leftover root of an interrupted create or branch: %w", name, err)
	}
	e.log.Warn("removed the root an interrupted create or branch left", "sandbox", name, "dir", e.home.sandboxDir(name))
	if m != nil {
		m.Names = slices.DeleteFunc(m.Names, func(n string) bool { return n == name })
		if len(m.Names) == 0 {
			os.Remove(markFile)
		} else if b, err := json.Marshal(m); err == nil {
			writeDurable(markFile, string(b))
		}
	}
	return nil
}

// errUnknownDir is the error about a root the catalog does not know and no
// marker explains, with advice that works.
func (e *Engine) errUnknownDir(name string) error {
	return fmt.Errorf("sandbox %s: directory %s exists but the catalog does not know it: a leftover of an interrupted create or branch, or a sandbox whose catalog entry was lost ("+
		"`turnsnap catalog rebuild` brings a lost sandbox back from the store; `turnsnap sandbox rm %s` removes the directory): %w",
		name, e.home.sandboxDir(name), name, errdefs.ErrExists)
}

// removeUnknown is `sandbox rm` of a name the catalog does not know: a
// root left there (by a killed create or branch, or forgotten) is removed.
// No root either: the catalog's not-found error stands.
func (e *Engine) removeUnknown(ctx context.Context, name string, notFound error) error {
	if !errors.Is(notFound, errdefs.ErrNotFound) {
		return notFound
	}
	if _, err := os.Lstat(e.home.sandboxDir(name)); err != nil || !delta.ValidRefName(name) {
		return notFound
	}
	m, p := e.leftoverMark(name)
	return e.removeLeftover(ctx, name, m, p)
}
