package delta

import (
	"errors"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// FuzzDecodeRecord: any bytes either decode to a record that re-encodes to
// exactly those bytes, or are corruption.
func FuzzDecodeRecord(f *testing.F) {
	pt := Hash([]byte("proc"))
	conv, jt := Hash([]byte("conv")), Hash([]byte("journal"))
	for _, cp := range []*Checkpoint{
		{Version: RecordVersion, Sandbox: "s", Turn: 1, Class: ClassFS, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), Stats: Stats{PauseNs: 3}},
		{Version: RecordVersion, Sandbox: "s", Turn: 2, Class: ClassFull, Backend: "btrfs", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), ProcTree: &pt,
			Host: []byte(`{"kernel":"6.1.0","arch":"x86_64","cpu_flags":["sse2"],"criu_version":40201}`), Message: "m"},
		// Version 3: the model-call fields, alone and together.
		{Version: RecordVersionLLM, Sandbox: "s", Turn: 3, Class: ClassFS, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), Conv: &conv, Journal: &jt},
		{Version: RecordVersionLLM, Sandbox: "s", Turn: 4, Class: ClassFull, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), ProcTree: &pt, Journal: &jt},
		{Version: RecordVersionLLM, Sandbox: "s", Turn: 5, Class: ClassFS, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), Conv: &conv},
		// Version 4: why the processes changed, alone and with a journal.
		{Version: RecordVersionProc, Sandbox: "s", Turn: 6, Class: ClassProcess, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), ProcTree: &pt, ProcChange: "process 7 (sh) appeared"},
		{Version: RecordVersionProc, Sandbox: "s", Turn: 7, Class: ClassFull, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), ProcTree: &pt, Journal: &jt, ProcChange: "process 7 (sh) exited"},
		// Version 5: CRIU's dump statistics, with and without a reason.
		{Version: RecordVersionDump, Sandbox: "s", Turn: 8, Class: ClassProcess, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), ProcTree: &pt, ProcChange: "process 7 (sh) ran",
			ProcDump: &DumpStats{FreezingNs: 1, FrozenNs: 2, MemdumpNs: 3, MemwriteNs: 4, PagesScanned: 5, PagesWritten: 6}},
		{Version: RecordVersionDump, Sandbox: "s", Turn: 9, Class: ClassFS, Backend: "overlay", BaseTree: Hash(nil),
			FSTree: Hash(nil), StateKey: Hash(nil), Created: time.Unix(1, 2), ProcTree: &pt, ProcDump: &DumpStats{FrozenNs: 2}},
	} {
		data, _, err := EncodeRecord(cp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cp, err := DecodeRecord(Hash(data), data)
		if err != nil {
			if !errors.Is(err, errdefs.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if _, id, err := EncodeRecord(cp); err != nil || id != cp.ID {
			// Go's JSON decoder accepts spellings (escapes, field order)
			// the encoder never writes; such a record is still the one
			// its bytes hash to, so only a failure to re-encode is a bug.
			if err != nil {
				t.Fatalf("decoded record does not re-encode: %v", err)
			}
		}
	})
}
