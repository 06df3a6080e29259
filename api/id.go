// Package api is turnsnap's wire types: every request, response and event
// of the daemon's HTTP API (docs/openapi.yaml), as plain structs whose JSON
// is what goes on the wire. It imports only the standard library, so a
// client (package client, or any Go program) can speak the API without
// linking the engine, its storage or CRIU. The daemon (package server)
// converts the engine's results into these types.
package api

import "time"

// ID is a content ID (a checkpoint, a tree) as the API spells it: 64
// lowercase hex digits, or "" for no ID (a root checkpoint's parent).
type ID string

// ShortLen is the number of hex digits Short prints (delta.ShortLen).
const ShortLen = 12

// String returns the full hex form.
func (id ID) String() string { return string(id) }

// Short returns the first ShortLen hex digits, for display.
func (id ID) Short() string {
	if len(id) < ShortLen {
		return string(id)
	}
	return string(id[:ShortLen])
}

// IsZero reports whether id names nothing.
func (id ID) IsZero() bool { return id == "" }

// Class says what a checkpoint captured.
//
// The wire form of delta.Class.
type Class string

// The classes (delta.ClassSkip ...).
const (
	// ClassSkip: nothing changed since the parent.
	ClassSkip Class = "skip"
	// ClassFS: the filesystem changed; no process state was captured.
	ClassFS Class = "fs"
	// ClassProcess: process state was captured; the filesystem is unchanged.
	ClassProcess Class = "process"
	// ClassFull: both filesystem and process state were captured.
	ClassFull Class = "full"
)

// MS is d as every duration_ms field of the API carries it: milliseconds
// with microsecond precision.
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Dur is the inverse of MS, for printing.
func Dur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
