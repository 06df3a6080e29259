package catalog

import (
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// testRecord returns a valid record; turn and created vary it.
func testRecord(sandbox string, parent delta.ID, turn int, created time.Time) *delta.Checkpoint {
	return &delta.Checkpoint{
		Version:  delta.RecordVersion,
		Sandbox:  delta.SandboxName(sandbox),
		Parent:   parent,
		Turn:     turn,
		Class:    delta.ClassFS,
		Backend:  "overlay",
		BaseTree: delta.Hash([]byte("base " + sandbox)),
		FSTree:   delta.Hash([]byte{byte(turn), byte(turn >> 8), byte(turn >> 16)}),
		StateKey: delta.Hash([]byte("state")),
		Message:  "turn <&> message",
		Created:  created,
		Stats:    delta.Stats{Entries: 10, FilesRead: 2, BytesRead: 300, BlobsNew: 1, BytesNew: 90, ObjectsNew: 2, DurationNs: 12345},
	}
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
