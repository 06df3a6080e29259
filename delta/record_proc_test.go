package delta

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A record that says why its processes changed is version 4; one without the
// reason keeps its version 2 or 3 bytes; every spelling that mixes the two
// up, or carries a reason no writer would write, is corrupt.
func TestRecordVersion4ProcChange(t *testing.T) {
	cp := plainRecord(t, "proc_change")
	cp.ProcChange = "process 12 (httpd) appeared"
	if _, _, err := EncodeRecord(cp); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("version 2 with proc_change: %v", err)
	}
	cp.Version = VersionFor(cp)
	if cp.Version != RecordVersionProc {
		t.Fatalf("version %d", cp.Version)
	}
	data, id, err := EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(id, data)
	if err != nil || got.ProcChange != cp.ProcChange {
		t.Fatalf("decode: %v %q", err, got.ProcChange)
	}
	// With a journal it is still version 4.
	jt := Hash([]byte("journal"))
	cp.Journal = &jt
	if VersionFor(cp) != RecordVersionProc {
		t.Fatalf("journal + proc_change: version %d", VersionFor(cp))
	}

	decodeEachEdit(t, data, map[string]func(map[string]any){
		"v4 without reason": func(m map[string]any) { delete(m, "proc_change") },
		"v3 with reason":    func(m map[string]any) { m["version"] = 3; m["conv"] = Hash(nil).String() },
		"v2 with reason":    func(m map[string]any) { m["version"] = 2 },
		"control chars":     func(m map[string]any) { m["proc_change"] = "a\x1b[2Jb" },
		"too long":          func(m map[string]any) { m["proc_change"] = strings.Repeat("x", MaxProcChangeLen+1) },
		"not a string":      func(m map[string]any) { m["proc_change"] = 7 },
	})
}

// ProcChangeReason makes any reason fit: bounded on a rune boundary, no
// control characters, valid UTF-8, and a record with it encodes.
func TestProcChangeReasonBounds(t *testing.T) {
	for _, why := range []string{
		"process 1 (sh) now runs \"" + strings.Repeat("é", 2000) + "\"",
		"line\nbreak\ttab\x00nul",
		"bad \xff\xfe utf8",
		strings.Repeat("a", MaxProcChangeLen),
	} {
		r := ProcChangeReason(why)
		if len(r) > MaxProcChangeLen || !utf8.ValidString(r) || strings.ContainsAny(r, "\n\t\x00") {
			t.Fatalf("%q -> %q", why[:min(40, len(why))], r[:min(40, len(r))])
		}
		if ProcChangeReason(r) != r {
			t.Fatalf("not idempotent: %q", r[:min(40, len(r))])
		}
		cp := testRecord("agent", Hash([]byte("parent")), 3, t0)
		cp.ProcChange = r
		cp.Version = VersionFor(cp)
		if _, _, err := EncodeRecord(cp); err != nil {
			t.Fatal(err)
		}
	}
	if r := ProcChangeReason(strings.Repeat("a", MaxProcChangeLen)); r != strings.Repeat("a", MaxProcChangeLen) {
		t.Fatal("a reason at the limit was cut")
	}
}
