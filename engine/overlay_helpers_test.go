package engine

import "github.com/turnsnap/turnsnap/overlay"

// overlayOf is e's overlay backend: tests look at its frozen layers,
// their policy and its change trackers.
func overlayOf(e *Engine) *overlay.Backend {
	ob, _ := e.backends[overlay.Name].(*overlay.Backend)
	return ob
}
