package delta

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A mark object round-trips; one under another home's name, with a record
// listed twice, or due before it was marked is ErrCorrupt naming it.
func TestMarksRoundTripAndReject(t *testing.T) {
	home := NewSandboxID()
	now := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	m := &Marks{Version: 1, Home: home, Records: []Mark{
		{ID: Hash([]byte("a")), Sandbox: NewSandboxID(), Marked: now, Due: now.Add(time.Hour)},
		{ID: Hash([]byte("b")), Sandbox: "legacy-name", Marked: now, Due: now},
	}}
	data, err := EncodeMarks(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeMarks(MarkName(home), data)
	if err != nil || len(got.Records) != 2 || got.Records[0] != m.Records[0] {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := map[string]func(*Marks){
		"twice":      func(m *Marks) { m.Records[1].ID = m.Records[0].ID },
		"due before": func(m *Marks) { m.Records[0].Due = now.Add(-time.Second) },
		"version":    func(m *Marks) { m.Version = 2 },
		"bad key":    func(m *Marks) { m.Records[0].Sandbox = "../x" },
	}
	for what, edit := range bad {
		c := *m
		c.Records = append([]Mark(nil), m.Records...)
		edit(&c)
		data, _ := EncodeMarks(&c)
		if _, err := DecodeMarks(MarkName(home), data); !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), MarkName(home)) {
			t.Errorf("%s: %v, want ErrCorrupt naming the object", what, err)
		}
	}
	if _, err := DecodeMarks(MarkName(NewSandboxID()), data); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Errorf("another home's name: %v", err)
	}
}
