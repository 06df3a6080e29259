// Package track records which paths of a mounted overlay root changed, from
// the kernel's fanotify events (docs/TRACKING.md): a Tracker's record is
// what a turn then scans instead of walking the whole layer. It knows
// nothing of roots' layouts; package overlay scans through it and keeps
// one per tracked sandbox.
package track
