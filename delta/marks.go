package delta

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Retention deletes records in two phases on a shared bucket (docs/STORAGE.md,
// "Sharing a bucket"): prune and forget first mark the records they mean
// to delete in the home's mark object, and a later run (or the same one,
// with no grace) sweeps them, re-reading every ref in the bucket just
// before it deletes. Another home that branches from a marked checkpoint
// in between names it in a ref, and the sweep leaves it (and unmarks it).

// MarkPrefix starts mark objects: MarkPrefix || home id, one per home,
// written only by that home.
const MarkPrefix = "marks/"

// MarkName is the store name of the mark object of the home with this id.
func MarkName(home string) string { return MarkPrefix + home }

// MaxMarks bounds the entries of one mark object, and MaxMarksObject its
// size (an entry is under 200 bytes of JSON). A run that would mark more
// leaves the rest for a later run.
const (
	MaxMarks       = 100_000
	MaxMarksObject = 32 << 20
)

// Marks is the JSON content of a mark object.
type Marks struct {
	Version int    `json:"version"` // 1
	Home    string `json:"home"`    // the marking home's id; equals the object name's
	Records []Mark `json:"records"`
}

// Mark is one record a home intends to delete. Due is the earliest time
// a sweep may delete it: Marked plus the grace the marking run was given.
type Mark struct {
	ID      ID        `json:"id"`
	Sandbox string    `json:"sandbox"` // the record's sandbox key, for unmarking what a later policy keeps
	Marked  time.Time `json:"marked"`
	Due     time.Time `json:"due"`
}

// EncodeMarks is the content of m's mark object.
func EncodeMarks(m *Marks) ([]byte, error) {
	if len(m.Records) > MaxMarks {
		return nil, fmt.Errorf("mark object of home %s: %d records, at most %d: %w", m.Home, len(m.Records), MaxMarks, errdefs.ErrInvalid)
	}
	return json.Marshal(m)
}

// DecodeMarks decodes the mark object stored under name. Anything a home's
// EncodeMarks could not have written is ErrCorrupt, naming the object.
func DecodeMarks(name string, data []byte) (*Marks, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("object %s: %s: %w", name, fmt.Sprintf(format, a...), errdefs.ErrCorrupt)
	}
	if len(data) > MaxMarksObject {
		return nil, bad("%d bytes, more than %d", len(data), MaxMarksObject)
	}
	var m Marks
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, bad("%v", err)
	}
	switch {
	case m.Version != 1:
		return nil, bad("version %d, want 1", m.Version)
	case !ValidSandboxID(m.Home) || MarkName(m.Home) != name:
		return nil, bad("home %q does not match the object name", truncate(m.Home, 40))
	case len(m.Records) > MaxMarks:
		return nil, bad("%d records, at most %d", len(m.Records), MaxMarks)
	}
	seen := make(map[ID]bool, len(m.Records))
	for _, r := range m.Records {
		switch {
		case r.ID.IsZero() || seen[r.ID]:
			return nil, bad("record %s is zero or listed twice", r.ID.Short())
		case !ValidSandboxID(r.Sandbox) && !ValidRefName(r.Sandbox):
			return nil, bad("record %s: sandbox key %q is not valid", r.ID.Short(), truncate(r.Sandbox, 40))
		case r.Due.Before(r.Marked):
			return nil, bad("record %s: due before it was marked", r.ID.Short())
		}
		seen[r.ID] = true
	}
	return &m, nil
}
