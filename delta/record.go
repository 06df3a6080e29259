package delta

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// RecordVersion is the checkpoint record format this package writes for a
// record without model-call fields. A record is addressed by its hash, so
// any change to its encoding is a new version, never an edit of an old one.
const RecordVersion = 2

// RecordVersionLLM is the version of a record with a model-call field
// (conv or journal, docs/FORMAT.md "Record version 3"): records without them
// stay version 2 byte for byte, and a reader that knows only version 2
// refuses these as a newer version rather than drop the journal.
const RecordVersionLLM = 3

// RecordVersionProc is the version of a record that says why its processes
// counted as changed (proc_change, docs/FORMAT.md "Record version 4"). It may
// carry the model-call fields too. Records without the field keep their
// version 2 or 3 bytes, and a reader that knows only up to 3 refuses these
// as a newer version rather than drop the reason.
const RecordVersionProc = 4

// MaxRecordVersion is the newest record format this package reads.
const MaxRecordVersion = RecordVersionDump

// MaxProcChangeLen bounds a record's proc_change: the reason is a summary
// (at most three causes, proc.Changed), but it quotes command lines, which
// have no bound of their own.
const MaxProcChangeLen = 1024

// VersionFor is the version a writer gives cp: RecordVersionDump when it
// carries CRIU's dump statistics, RecordVersionProc when it says why its
// processes changed, RecordVersionLLM when it has a model-call field,
// RecordVersion otherwise.
func VersionFor(cp *Checkpoint) int {
	switch {
	case cp.ProcDump != nil:
		return RecordVersionDump
	case cp.ProcChange != "":
		return RecordVersionProc
	case cp.Conv != nil || cp.Journal != nil:
		return RecordVersionLLM
	}
	return RecordVersion
}

// ProcChangeReason makes why fit a record's proc_change: cut at
// MaxProcChangeLen on a rune boundary, control characters replaced (it is
// shown on terminals and in HTML).
func ProcChangeReason(why string) string {
	why = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(why, "?"))
	if len(why) <= MaxProcChangeLen {
		return why
	}
	cut := MaxProcChangeLen - len("...")
	for cut > 0 && !utf8.RuneStart(why[cut]) {
		cut--
	}
	return why[:cut] + "..."
}

// MinRecordVersion is the oldest record format this package still reads.
// Version 1 records have no sandbox_id: they belong to the sandbox their
// name labels in the store that holds them (docs/FORMAT.md, "Sandbox identity").
const MinRecordVersion = 1

// MaxRecordSize is the largest record a reader accepts (docs/FORMAT.md,
// "Limits"); a record is a few hundred bytes plus its message.
const MaxRecordSize = 1 << 20

// Class says what a checkpoint captured.
type Class string

const (
	// ClassSkip: nothing changed since the parent. No record is written
	// for a skip turn unless the caller asks for one (a record with its
	// parent's roots, docs/FORMAT.md "Skip records"); the class is what
	// Checkpoint reports for it.
	ClassSkip Class = "skip"
	// ClassFS: the filesystem changed; no process state was captured.
	ClassFS Class = "fs"
	// ClassProcess: process state was captured; the filesystem is unchanged.
	ClassProcess Class = "process"
	// ClassFull: both filesystem and process state were captured.
	ClassFull Class = "full"
)

func (c Class) known() bool {
	switch c {
	case ClassSkip, ClassFS, ClassProcess, ClassFull:
		return true
	}
	return false
}

// Stats are the measurements of the run that produced a checkpoint. They are
// part of the record (and so of its hash) because they are what `turnsnap
// log` shows and they cannot be recomputed later.
type Stats struct {
	Entries    int64 `json:"entries"`    // tree entries in the checkpoint's fs tree scan
	FilesRead  int64 `json:"files_read"` // files whose content was read (cache misses)
	BytesRead  int64 `json:"bytes_read"`
	BlobsNew   int64 `json:"blobs_new"` // blobs stored for the first time
	BytesNew   int64 `json:"bytes_new"` // bytes of new objects written to the store
	ObjectsNew int64 `json:"objects_new"`
	DurationNs int64 `json:"duration_ns"`
	// PauseNs is how long the sandbox's processes were frozen for the cut
	// (0 when none were paused).
	PauseNs int64 `json:"pause_ns,omitempty"`
}

// Checkpoint is the checkpoint record: stored in the object store as an
// object named by its hash, and indexed in the catalog by the same bytes.
type Checkpoint struct {
	ID      ID          `json:"-"`       // Hash of the encoded record; never inside it
	Version int         `json:"version"` // record format version, RecordVersion
	Sandbox SandboxName `json:"sandbox"` // a ValidRefName: the sandbox's label on the home that wrote it
	// SandboxID is the identity of the sandbox (Sandbox.ID), which a label
	// shared by two homes cannot give. Version 1 records never have one; in
	// version 2 it is empty only for a legacy sandbox (one without an ID).
	SandboxID string `json:"sandbox_id,omitempty"`
	Parent    ID     `json:"parent"`    // zero for a sandbox's first checkpoint created from a base
	Turn      int    `json:"turn"`      // agent turn number, >= 0
	Class     Class  `json:"class"`     // what was captured
	Backend   string `json:"backend"`   // "overlay" or "btrfs"
	BaseTree  ID     `json:"base_tree"` // tree of the read-only base (sandbox identity)
	FSTree    ID     `json:"fs_tree"`   // tree of the writable layer (overlay upper) at this checkpoint
	StateKey  ID     `json:"state_key"` // hash used to decide "no change" (see engine); not a stored object
	// ProcTree is the tree of the CRIU image of the sandbox's long-lived
	// processes at this checkpoint, nil when it had none. A checkpoint whose
	// processes did not change carries its parent's image forward.
	ProcTree *ID `json:"proc_tree,omitempty"`
	// Host holds the facts of the host that dumped ProcTree (kernel, CPU
	// flags, CRIU version), checked before processes are restored; kept as
	// raw JSON so the catalog need not know the process layer's types.
	Host json.RawMessage `json:"host,omitempty"`
	// ProcDump is what CRIU measured while dumping ProcTree (frozen time,
	// pages written), carried forward with the image like Host. Version 5
	// only (delta/dumpstats.go).
	ProcDump *DumpStats `json:"proc_dump,omitempty"`
	// Conv is the conversation hash of the model call that closed this turn
	// (the LLM proxy's turns), so `turnsnap log` can say which call the
	// checkpoint precedes. Version 3 only.
	Conv *ID `json:"conv,omitempty"`
	// Journal is the tree of the model exchanges the sandbox's conversation
	// holds at this checkpoint (one file per exchange), restored with it so a
	// replaying agent is answered from it. It is one of the record's roots,
	// so everything that follows a checkpoint's trees follows it. Version 3
	// only.
	Journal *ID `json:"journal,omitempty"`
	// ProcChange says why the turn counted as a process change (a process
	// appeared, exited, was written to; proc.Changed's summary), so the
	// audit can say it later. Version 4 only; empty when the processes did
	// not change.
	ProcChange string    `json:"proc_change,omitempty"`
	Message    string    `json:"message,omitempty"`
	Created    time.Time `json:"created"` // UTC, nanosecond precision
	Stats      Stats     `json:"stats"`
}

// validate checks what EncodeRecord promises and DecodeRecord re-checks. The
// errors are unwrapped descriptions; callers add the class (ErrInvalid when
// encoding, ErrCorrupt when decoding).
func (cp *Checkpoint) validate() error {
	switch {
	case cp.Version < MinRecordVersion || cp.Version > MaxRecordVersion:
		return fmt.Errorf("record version %d, want %d..%d", cp.Version, MinRecordVersion, MaxRecordVersion)
	case max(cp.Version, RecordVersion) != VersionFor(cp):
		// A writer gives a record the version of its newest field (conv or
		// journal 3, proc_change 4, proc_dump 5), so the fields name it.
		return fmt.Errorf("version %d record has the fields of version %d", cp.Version, VersionFor(cp))
	case len(cp.ProcChange) > MaxProcChangeLen:
		return fmt.Errorf("proc_change of %d bytes, more than the limit %d", len(cp.ProcChange), MaxProcChangeLen)
	case cp.ProcChange != "" && ProcChangeReason(cp.ProcChange) != cp.ProcChange:
		return fmt.Errorf("proc_change holds control characters or invalid UTF-8")
	case cp.Conv != nil && cp.Conv.IsZero():
		return fmt.Errorf("conversation hash is zero")
	case cp.Journal != nil && cp.Journal.IsZero():
		return fmt.Errorf("journal tree is zero")
	case cp.Version == 1 && cp.SandboxID != "":
		return fmt.Errorf("version 1 record has a sandbox_id")
	case cp.SandboxID != "" && !ValidSandboxID(cp.SandboxID):
		return fmt.Errorf("sandbox id %q is not valid", cp.SandboxID)
	case !ValidRefName(string(cp.Sandbox)):
		return fmt.Errorf("sandbox name %q is not valid", cp.Sandbox)
	case !cp.Class.known():
		return fmt.Errorf("unknown class %q", cp.Class)
	case cp.BaseTree.IsZero():
		return fmt.Errorf("base tree is zero")
	case cp.FSTree.IsZero():
		return fmt.Errorf("fs tree is zero")
	case cp.Turn < 0:
		return fmt.Errorf("turn %d is negative", cp.Turn)
	case cp.Created.IsZero():
		// The sandbox index key orders by Created; a zero time would put the
		// checkpoint before every real one and outside UnixNano's range.
		return fmt.Errorf("created time is zero")
	}
	return cp.validDump()
}

// EncodeRecord returns the canonical bytes of cp and their hash, which is the
// checkpoint's ID. The encoding is encoding/json of the struct with Created
// converted to UTC, so equal records always hash to the same ID regardless of
// the caller's time zone or monotonic clock reading. cp.ID is ignored.
func EncodeRecord(cp *Checkpoint) ([]byte, ID, error) {
	if cp == nil {
		return nil, ID{}, fmt.Errorf("encode checkpoint record: nil record: %w", errdefs.ErrInvalid)
	}
	c := *cp
	c.Created = c.Created.UTC()
	if err := c.validate(); err != nil {
		return nil, ID{}, fmt.Errorf("encode checkpoint record of sandbox %q turn %d: %v: %w",
			cp.Sandbox, cp.Turn, err, errdefs.ErrInvalid)
	}
	data, err := json.Marshal(&c)
	if err != nil {
		return nil, ID{}, fmt.Errorf("encode checkpoint record of sandbox %q turn %d: %w", cp.Sandbox, cp.Turn, err)
	}
	return data, Hash(data), nil
}

// DecodeRecord parses the record stored under id. The bytes must hash to id:
// the record is fetched from the store or the catalog by that name, and a
// mismatch means the bytes are not the checkpoint the caller asked for.
func DecodeRecord(id ID, data []byte) (*Checkpoint, error) {
	if len(data) > MaxRecordSize {
		return nil, fmt.Errorf("checkpoint %s: record of %d bytes, more than the limit %d: %w", id, len(data), MaxRecordSize, errdefs.ErrCorrupt)
	}
	if got := Hash(data); got != id {
		return nil, fmt.Errorf("checkpoint %s: record hashes to %s: %w", id, got, errdefs.ErrCorrupt)
	}
	// Look at the version before decoding strictly, so a record from a newer
	// turnsnap is reported as such rather than as "unknown field".
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("checkpoint %s: decode record: %v: %w", id, err, errdefs.ErrCorrupt)
	}
	if v.Version < MinRecordVersion || v.Version > MaxRecordVersion {
		return nil, fmt.Errorf("checkpoint %s: record version %d is a newer version than this turnsnap reads (%d..%d): %w",
			id, v.Version, MinRecordVersion, MaxRecordVersion, errdefs.ErrCorrupt)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	cp := new(Checkpoint)
	if err := dec.Decode(cp); err != nil {
		return nil, fmt.Errorf("checkpoint %s: decode record: %v: %w", id, err, errdefs.ErrCorrupt)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("checkpoint %s: decode record: trailing data: %w", id, errdefs.ErrCorrupt)
	}
	if err := cp.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %v: %w", id, err, errdefs.ErrCorrupt)
	}
	cp.ID = id
	return cp, nil
}

// SandboxKey is what identifies the checkpoint's sandbox across homes: its
// sandbox id, or for a version 1 record its name.
func (cp *Checkpoint) SandboxKey() SandboxKey {
	if cp.SandboxID != "" {
		return SandboxKey(cp.SandboxID)
	}
	return SandboxKey(cp.Sandbox)
}

// MaxNameLen is the longest sandbox or tag name. Names appear in paths,
// mount options and keys; 64 keeps all of those comfortably short.
const MaxNameLen = 64

// ValidRefName reports whether name may name a sandbox or tag: 1..MaxNameLen
// characters of [A-Za-z0-9._-], not starting with '.' (hidden files, "..")
// or '-' (would parse as a flag).
func ValidRefName(name string) bool {
	if len(name) == 0 || len(name) > MaxNameLen || name[0] == '.' || name[0] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Roots lists the trees a checkpoint references: its base, its writable
// layer and, if it has them, its process image and its model-call journal.
// Everything that follows a checkpoint's trees (refcounts, prune, gc, push,
// rebuild, verify) takes them from here; only the writable layer (index 1)
// is an overlay layer, the others are plain states.
func (cp *Checkpoint) Roots() []ID {
	r := []ID{cp.BaseTree, cp.FSTree}
	if cp.ProcTree != nil {
		r = append(r, *cp.ProcTree)
	}
	if cp.Journal != nil {
		r = append(r, *cp.Journal)
	}
	return r
}
