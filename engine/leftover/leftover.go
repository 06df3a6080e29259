// Package leftover owns the creation markers of creates and branches, and
// the removal of the roots a killed create or branch left behind.
package leftover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
	"github.com/turnsnap/turnsnap/internal/rootfs"
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

// Deps is what the markers need from the engine.
type Deps struct {
	// IntentsDir holds the markers (HOME/intents).
	IntentsDir string
	// SandboxDir is a sandbox's root (HOME/sandboxes/NAME).
	SandboxDir func(name string) string
	// Backend opens the backend a marker names; DefaultBackend is the one
	// a root no marker names is removed as.
	Backend        func(name string, cfg json.RawMessage) (rootfs.Backend, error)
	DefaultBackend string
	Log            *slog.Logger
}

// Roots are the creation markers of one home and the leftover roots they
// explain.
type Roots struct{ d Deps }

// New returns the markers of the home d describes.
func New(d Deps) *Roots { return &Roots{d: d} }

// Mark is the marker of a killed create or branch, and its file.
type Mark struct {
	m    creatingMark
	file string
}

type creatingMark struct {
	Holder  string          `json:"holder"` // proc.Holder of the creating process
	Names   []string        `json:"names"`
	Backend string          `json:"backend"`
	Config  json.RawMessage `json:"config,omitempty"`
}

// Creating writes the marker of a create or branch of names, durable
// before any root exists, and returns a function that removes it (call it
// once the catalog knows the sandboxes, or once the roots are undone).
func (r *Roots) Creating(names []string, backend string, cfg json.RawMessage) (func(), error) {
	if err := os.MkdirAll(r.d.IntentsDir, 0o700); err != nil {
		return nil, err
	}
	m := creatingMark{Holder: proc.Self().String(), Names: names, Backend: backend, Config: cfg}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(r.d.IntentsDir, m.Holder+"-*.creating")
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: creation marker: %w", names[0], err)
	}
	p := f.Name()
	f.Close()
	if err := fsat.WriteFileDurable(p, string(body)); err != nil {
		os.Remove(p)
		return nil, fmt.Errorf("sandbox %s: creation marker: %w", names[0], err)
	}
	return func() { os.Remove(p) }, nil
}

// Find finds the marker of a create or branch of name whose process is
// gone (or is this one: its undo failed); nil if there is none.
func (r *Roots) Find(name string) *Mark {
	files, _ := filepath.Glob(filepath.Join(r.d.IntentsDir, "*.creating"))
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
			return &Mark{m: m, file: p}
		}
	}
	return nil
}

// Remove removes the root of name that a killed create or branch left
// (mk: its marker, nil: unknown, removed as a root of the default
// backend), and drops name from the marker.
func (r *Roots) Remove(ctx context.Context, name string, mk *Mark) error {
	backend := r.d.DefaultBackend
	var cfg json.RawMessage
	if mk != nil {
		backend, cfg = mk.m.Backend, mk.m.Config
	}
	be, err := r.d.Backend(backend, cfg)
	if err != nil {
		return fmt.Errorf("sandbox %s: leftover root: %w", name, err)
	}
	if err := be.Open(r.d.SandboxDir(name), "").Remove(ctx); err != nil {
		return fmt.Errorf("sandbox %s: leftover root of an interrupted create or branch: %w", name, err)
	}
	r.d.Log.Warn("removed the root an interrupted create or branch left", "sandbox", name, "dir", r.d.SandboxDir(name))
	if mk != nil {
		m := &mk.m
		m.Names = slices.DeleteFunc(m.Names, func(n string) bool { return n == name })
		if len(m.Names) == 0 {
			os.Remove(mk.file)
		} else if b, err := json.Marshal(m); err == nil {
			fsat.WriteFileDurable(mk.file, string(b))
		}
	}
	return nil
}

// ErrUnknown is the error about a root the catalog does not know and no
// marker explains, with advice that works.
func (r *Roots) ErrUnknown(name string) error {
	return fmt.Errorf("sandbox %s: directory %s exists but the catalog does not know it: a leftover of an interrupted create or branch, or a sandbox whose catalog entry was lost ("+
		"`turnsnap catalog rebuild` brings a lost sandbox back from the store; `turnsnap sandbox rm %s` removes the directory): %w",
		name, r.d.SandboxDir(name), name, errdefs.ErrExists)
}

// RemoveUnknown is `sandbox rm` of a name the catalog does not know: a
// root left there (by a killed create or branch, or forgotten) is removed.
// No root either: the catalog's not-found error stands.
func (r *Roots) RemoveUnknown(ctx context.Context, name string, notFound error) error {
	if !errors.Is(notFound, errdefs.ErrNotFound) {
		return notFound
	}
	if _, err := os.Lstat(r.d.SandboxDir(name)); err != nil || !delta.ValidRefName(name) {
		return notFound
	}
	return r.Remove(ctx, name, r.Find(name))
}
