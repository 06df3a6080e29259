package delta

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A record without model-call fields is version 2, byte for byte what it was
// before version 3 existed; one with conv or journal is version 3, and the
// journal is one of its roots.
func TestRecordVersion3(t *testing.T) {
	cp := testRecord("agent", Hash([]byte("parent")), 3, t0)
	if VersionFor(cp) != RecordVersion {
		t.Fatalf("plain record: version %d", VersionFor(cp))
	}
	v2, _, err := EncodeRecord(cp)
	if err != nil {
		t.Fatal(err)
	}
	// The version 2 encoding, spelt out: no conv, no journal key at all.
	want := `{"version":2,"sandbox":"agent","parent":"` + Hash([]byte("parent")).String() + `","turn":3,"class":"fs","backend":"overlay","base_tree":"` +
		Hash([]byte("base agent")).String() + `","fs_tree":"` + cp.FSTree.String() + `","state_key":"` + Hash([]byte("state")).String() +
		`","message":"turn \u003c\u0026\u003e message","created":"2025-03-01T12:00:00.123456789Z","stats":{"entries":10,"files_read":2,"bytes_read":300,"blobs_new":1,"bytes_new":90,"objects_new":2,"duration_ns":12345}}`
	if string(v2) != want {
		t.Fatalf("version 2 bytes changed:\n got %s\nwant %s", v2, want)
	}
	conv, jt := Hash([]byte("conv")), Hash([]byte("journal"))
	cp.Conv, cp.Journal = &conv, &jt
	if _, _, err := EncodeRecord(cp); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("version 2 with a journal: %v", err)
	}
	cp.Version = VersionFor(cp)
	data, id, err := EncodeRecord(cp)
	if err != nil || cp.Version != RecordVersionLLM {
		t.Fatalf("version %d: %v", cp.Version, err)
	}
	if !bytes.Contains(data, []byte(`"conv":"`+conv.String()+`","journal":"`+jt.String()+`"`)) {
		t.Fatalf("record lacks conv and journal: %s", data)
	}
	got, err := DecodeRecord(id, data)
	if err != nil || *got.Conv != conv || *got.Journal != jt {
		t.Fatalf("decode: %v", err)
	}
	if r := got.Roots(); !slices.Equal(r, []ID{cp.BaseTree, cp.FSTree, jt}) {
		t.Fatalf("roots %v", r)
	}
	// Version 3 without either field is not a spelling writers use.
	var m map[string]any
	json.Unmarshal(v2, &m)
	m["version"] = 3
	b, _ := json.Marshal(m)
	if _, err := DecodeRecord(Hash(b), b); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("version 3 without model-call fields: %v", err)
	}
	// A reader refuses a version newer than it knows as such: a version 2
	// reader did so for version 3, and this one does for version 4.
	m["version"] = MaxRecordVersion + 1
	b, _ = json.Marshal(m)
	if _, err := DecodeRecord(Hash(b), b); !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "newer version") {
		t.Fatalf("version %d: %v", MaxRecordVersion+1, err)
	}
}
