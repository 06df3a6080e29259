package delta

import (
	"errors"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A record that carries CRIU's dump statistics is version 5, round-trips
// them, and is corrupt when they are misplaced: on a lower version, missing
// from a version 5 record, without a process image, or out of range. Records
// without them keep their earlier bytes.
func TestRecordVersion5ProcDump(t *testing.T) {
	cp := plainRecord(t, "proc_dump")
	pt := Hash([]byte("image"))
	cp.ProcTree = &pt
	cp.ProcChange = "process 12 (httpd) appeared"
	cp.ProcDump = &DumpStats{FrozenNs: 41e6, MemdumpNs: 3e6, MemwriteNs: 9e6, PagesScanned: 2048, PagesWritten: 900}
	cp.Version = RecordVersionProc
	if _, _, err := EncodeRecord(cp); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("version 4 with proc_dump: %v", err)
	}
	if cp.Version = VersionFor(cp); cp.Version != RecordVersionDump {
		t.Fatalf("version %d", cp.Version)
	}
	data, id, err := EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(id, data)
	if err != nil || got.ProcDump == nil || *got.ProcDump != *cp.ProcDump || got.ProcChange != cp.ProcChange {
		t.Fatalf("decode: %v %+v", err, got)
	}
	// Carried forward on a turn whose processes did not change: still 5.
	cp.ProcChange = ""
	if VersionFor(cp) != RecordVersionDump {
		t.Fatalf("carried proc_dump: version %d", VersionFor(cp))
	}

	decodeEachEdit(t, data, map[string]func(map[string]any){
		"v5 without proc_dump": func(m map[string]any) { delete(m, "proc_dump") },
		"v4 with proc_dump":    func(m map[string]any) { m["version"] = 4 },
		"v2 with proc_dump":    func(m map[string]any) { m["version"] = 2; delete(m, "proc_change") },
		"no image":             func(m map[string]any) { delete(m, "proc_tree") },
		"negative time":        func(m map[string]any) { m["proc_dump"] = map[string]any{"frozen_ns": -1} },
		"huge time":            func(m map[string]any) { m["proc_dump"] = map[string]any{"memwrite_ns": MaxDumpNs + 1} },
		"unknown stat":         func(m map[string]any) { m["proc_dump"] = map[string]any{"frozen_ns": 1, "surprise": 2} },
		"not an object":        func(m map[string]any) { m["proc_dump"] = 7 },
	})
}
