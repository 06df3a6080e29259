package api

import (
	"io"
	"time"
)

// The wire types. Each response is exactly the object the CLI prints with
// --json (the CLI prints these very structs, in direct mode too), so the
// fields are declared in the order of their JSON names: the CLI printed maps
// before, whose keys encoding/json sorts.

// CreateRequest is POST /v1/sandboxes.
type CreateRequest struct {
	Name      string `json:"name"`
	Base      string `json:"base"`
	Backend   string `json:"backend,omitempty"`    // overlay (default) or btrfs
	BtrfsPool string `json:"btrfs_pool,omitempty"` // btrfs: a directory on a mounted btrfs
}

// Created is a new sandbox.
type Created struct {
	Backend       string  `json:"backend"`
	BaseBytesRead int64   `json:"base_bytes_read"`
	BaseFiles     int64   `json:"files_base"`
	BaseTree      ID      `json:"base_tree"`
	BytesNew      int64   `json:"bytes_new"`
	Checkpoint    ID      `json:"checkpoint"`
	DurationMS    float64 `json:"duration_ms"`
	Name          string  `json:"name"`
	Root          string  `json:"root"`
}

// Sandbox is one row of the sandbox list (GET /v1/sandboxes) or one
// sandbox (GET /v1/sandboxes/{name}).
type Sandbox struct {
	Backend  string    `json:"backend"`
	BaseTree ID        `json:"base_tree"`
	Created  time.Time `json:"created"`
	Head     *ID       `json:"head,omitempty"`
	Name     string    `json:"name"`
	Origin   ID        `json:"origin"`
	Root     string    `json:"root"`
	Turn     *int      `json:"turn,omitempty"`
	// Lazy is the progress of the sandbox's lazy restore (BranchRequest
	// Lazy) in this daemon; absent when none runs.
	Lazy *LazyRestore `json:"lazy,omitempty"`
}

// LazyRestore is a lazy restore's progress (docs/STORAGE.md, "Lazy
// restore"): files still placeholders, files filled (on first access or by
// the fetch-ahead), and whether the root is whole.
type LazyRestore struct {
	Pending  int64 `json:"pending"`
	Filled   int64 `json:"filled"`
	Bytes    int64 `json:"bytes"`
	OnDemand int64 `json:"on_demand"`
	// Whole: every file is filled and synced; checkpoints no longer wait.
	Whole bool `json:"whole"`
	// Error names the object a fill could not read (missing or corrupt).
	Error string `json:"error,omitempty"`
}

// SandboxPath is POST /v1/sandboxes/{name}/mount: the mounted root.
type SandboxPath struct {
	Name string `json:"name"`
	Root string `json:"root"`
}

// Removed is DELETE /v1/sandboxes/{name}.
type Removed struct {
	Name    string `json:"name"`
	Removed bool   `json:"removed"`
}

// AdoptRequest is the body of POST /v1/sandboxes/{name}/adopt.
type AdoptRequest struct {
	// Force fences an owner whose host lease is live.
	Force bool `json:"force,omitempty"`
}

// Adopted is POST /v1/sandboxes/{name}/adopt: this home owns the sandbox
// now (docs/STORAGE.md, "Ownership and fencing").
type Adopted struct {
	Name string `json:"name"`
	// SandboxID is the sandbox's key in the bucket.
	SandboxID string `json:"sandbox_id"`
	// Head is the checkpoint the sandbox continues from: the bucket's head.
	Head string `json:"head"`
	// FromHome and FromEpoch name the owner that was fenced.
	FromHome  string `json:"from_home"`
	FromEpoch uint64 `json:"from_epoch"`
	// Home and Epoch are the new owner: this home.
	Home  string `json:"home"`
	Epoch uint64 `json:"epoch"`
	// Already is true when this home owned it before the call.
	Already bool `json:"already_owner,omitempty"`
	// OwnerLeaseLive says the fenced owner's host lease was live (Force).
	OwnerLeaseLive bool `json:"owner_lease_live,omitempty"`
}

// Resumed is POST /v1/sandboxes/{name}/resume.
type Resumed struct {
	FrozenBy  string `json:"frozen_by"`
	Name      string `json:"name"`
	WasFrozen bool   `json:"was_frozen"`
}

// CheckpointRequest is POST /v1/sandboxes/{name}/checkpoints.
type CheckpointRequest struct {
	Turn    *int   `json:"turn,omitempty"` // default: the parent's turn plus one
	Message string `json:"message,omitempty"`
	// WaitRemote returns only once the checkpoint is in the remote bucket.
	WaitRemote bool `json:"wait_remote,omitempty"`
	// RecordSkips writes a skip turn as a record of its own (no bytes).
	RecordSkips bool `json:"record_skips,omitempty"`
}

// Checkpoint is a closed turn.
type Checkpoint struct {
	BlobsNew   int64   `json:"blobs_new"`
	BytesNew   int64   `json:"bytes_new"`
	BytesRead  int64   `json:"bytes_read"`
	Class      Class   `json:"class"`
	DurationMS float64 `json:"duration_ms"`
	Entries    int64   `json:"entries"`
	FilesRead  int64   `json:"files_read"`
	ID         ID      `json:"id"`
	ObjectsNew int64   `json:"objects_new"`
	Parent     ID      `json:"parent"`
	// PhasesMS is where DurationMS went, by phase (freeze, scan, dump,
	// store, commit: those the turn went through), as the committed
	// event and turnsnap_checkpoint_phase_seconds report it.
	PhasesMS      map[string]float64 `json:"phases_ms,omitempty"`
	ProcessChange string             `json:"process_change"`
	RemoteDurable bool               `json:"remote_durable"`
	Sandbox       string             `json:"sandbox"`
	Turn          int                `json:"turn"`
}

// LogEntry is one checkpoint of GET /v1/sandboxes/{name}/checkpoints
// (newest first) or GET /v1/checkpoints/{ref}.
type LogEntry struct {
	// Backend is the root's kind the checkpoint was taken from (overlay,
	// btrfs): what a branch makes unless it asks for another.
	Backend  string `json:"backend"`
	BaseTree ID     `json:"base_tree"`
	// Branches are the other sandboxes that continue from this checkpoint
	// (branched from it, rolled back to it, or checkpointed on top of it).
	Branches []string  `json:"branches"`
	BytesNew int64     `json:"bytes_new"`
	Class    Class     `json:"class"`
	Conv     *ID       `json:"conv,omitempty"` // the model call that closed the turn (LLM proxy turns)
	Created  time.Time `json:"created"`
	FSTree   ID        `json:"fs_tree"`
	Head     bool      `json:"head"`
	ID       ID        `json:"id"`
	Message  string    `json:"message"`
	OnHead   bool      `json:"on_head"`
	Parent   ID        `json:"parent"`
	// PauseMS is how long the turn kept the sandbox's processes frozen
	// (0: none were).
	PauseMS float64 `json:"pause_ms,omitempty"`
	// Processes: the checkpoint holds a process image (its own or one
	// carried forward), which a restore brings back unless fs_only.
	Processes bool `json:"processes"`
	// ProcDump is CRIU's own statistics of the dump of the checkpoint's
	// process image (it may be a parent's, carried forward with the image).
	ProcDump *ProcDump `json:"proc_dump,omitempty"`
	Sandbox  string    `json:"sandbox"`
	Turn     int       `json:"turn"`
}

// ProcDump is what CRIU measured while dumping a process image (its
// stats-dump file, docs/PROCESSES.md "CRIU's own figures").
type ProcDump struct {
	FreezingMS   float64 `json:"freezing_ms"`
	FrozenMS     float64 `json:"frozen_ms"` // CRIU's frozen_time
	MemdumpMS    float64 `json:"memdump_ms"`
	MemwriteMS   float64 `json:"memwrite_ms"`
	PagesScanned uint64  `json:"pages_scanned"`
	PagesWritten uint64  `json:"pages_written"`
}

// Change is one path of a diff.
type Change struct {
	Change string `json:"change"` // added, modified, deleted
	Path   string `json:"path"`   // absolute inside the sandbox
	Type   string `json:"type"`
}

// Diff is GET /v1/sandboxes/{name}/diff.
type Diff struct {
	Changes []Change `json:"changes"`
	From    string   `json:"from"`
	Sandbox string   `json:"sandbox"`
	To      string   `json:"to"`
}

// RollbackRequest is POST /v1/sandboxes/{name}/rollback.
type RollbackRequest struct {
	Checkpoint string `json:"checkpoint"`
	FSOnly     bool   `json:"fs_only,omitempty"`
	// Abandon discards the sandbox's interrupted rollback instead of
	// finishing it: the root goes back to the head (no Checkpoint).
	Abandon bool `json:"abandon,omitempty"`
}

// BranchRequest is POST /v1/checkpoints/{ref}/branches.
type BranchRequest struct {
	Name string `json:"name"`
	// Names, if set, are more sandboxes made beside Name from the same
	// checkpoint, all or none (engine.BranchMany).
	Names []string `json:"names,omitempty"`
	// Count > 0 fans out: sandboxes NAME-1 ... NAME-COUNT.
	Count int `json:"count,omitempty"`
	// Materialise copies the layer from the store even where a frozen
	// layer of the checkpoint is kept on this host.
	Materialise bool   `json:"materialise,omitempty"`
	Backend     string `json:"backend,omitempty"`
	BtrfsPool   string `json:"btrfs_pool,omitempty"`
	FSOnly      bool   `json:"fs_only,omitempty"`
	// Lazy starts the one new sandbox before its files' bytes are on this
	// host: each file is fetched on first access, the rest in the
	// background (docs/STORAGE.md, "Lazy restore"). Overlay, one name, no
	// processes (fs_only for a checkpoint with processes). The result has
	// no receipt; checkpoints and rollbacks of the sandbox wait until its
	// restore is whole.
	Lazy bool `json:"lazy,omitempty"`
}

// MaxBranchCount bounds one fan-out request.
const MaxBranchCount = 256

// Restore is a rollback or a branch.
type Restore struct {
	Checkpoint ID      `json:"checkpoint"`
	DurationMS float64 `json:"duration_ms"`
	Processes  bool    `json:"processes"`
	Root       string  `json:"root"`
	Sandbox    string  `json:"sandbox"`
	Turn       int     `json:"turn"`
	// Receipt proves what the restore made (engine/receipt).
	Receipt *Receipt `json:"receipt,omitempty"`
	// PhasesMS is where a branch's fan-out spent its time, by phase
	// (prepare, roots, catalog, files, processes, one after another; and
	// image, base and layer, the parts of prepare that read the process
	// image, readied the base and readied the frozen layer), the same for
	// every branch of one request. A rollback and a lazy branch have none.
	PhasesMS map[string]float64 `json:"phases_ms,omitempty"`
}

// Verified is POST /v1/checkpoints/{ref}/verify.
type Verified struct {
	BaseChecked bool `json:"base_checked"`
	// FrozenChecked: this host's frozen layer of the checkpoint (which its
	// branches stack on) was re-hashed.
	FrozenChecked bool     `json:"frozen_checked"`
	Bytes         int64    `json:"bytes"`
	Checkpoint    ID       `json:"checkpoint"`
	Chunks        int64    `json:"chunks"`
	Entries       uint64   `json:"entries"`
	Objects       []string `json:"objects"`
	OK            bool     `json:"ok"`
	StateBytes    uint64   `json:"bytes_expanded"`
	Trees         int64    `json:"trees"`
}

// StoreVerifyRequest is POST /v1/store/verify.
type StoreVerifyRequest struct {
	Checkpoint string `json:"checkpoint,omitempty"` // "": every checkpoint in the store
}

// StoreVerified is the store-only check.
type StoreVerified struct {
	Blobs       int  `json:"blobs"`
	Checkpoints int  `json:"checkpoints"`
	OK          bool `json:"ok"`
	Packs       int  `json:"packs"`
	Refs        int  `json:"refs"`
}

// TagRequest is PUT /v1/tags/{tag}.
type TagRequest struct {
	Checkpoint string `json:"checkpoint"`
}

// Tagged is a tag set.
type Tagged struct {
	Checkpoint ID     `json:"checkpoint"`
	Sandbox    string `json:"sandbox"`
	Tag        string `json:"tag"`
	Turn       int    `json:"turn"`
}

// Untagged is DELETE /v1/tags/{tag}.
type Untagged struct {
	Deleted bool   `json:"deleted"`
	Tag     string `json:"tag"`
}

// Tag is one row of GET /v1/tags.
type Tag struct {
	Checkpoint ID     `json:"checkpoint"`
	Tag        string `json:"tag"`
}

// SyncRequest is POST /v1/sync.
type SyncRequest struct {
	Sandbox string `json:"sandbox,omitempty"` // "": every sandbox
}

// Synced is what a sync uploaded. Through the daemon, the background
// pusher may have uploaded part of it before the request came.
type Synced struct {
	Bytes      int64   `json:"bytes_uploaded"`
	Deleted    int     `json:"objects_deleted"`
	DurationMS float64 `json:"duration_ms"`
	Uploaded   int     `json:"objects_uploaded"`
}

// PruneRequest is POST /v1/prune.
type PruneRequest struct {
	KeepLast int  `json:"keep_last"`
	DryRun   bool `json:"dry_run,omitempty"`
	GC       bool `json:"gc,omitempty"` // run gc afterwards
	// GraceMS: with a remote, how long pruned records stay marked before a
	// later run deletes them; absent: retention.DefaultRecordGrace, 0: this
	// run sweeps them (after re-reading every ref in the bucket).
	GraceMS *int64 `json:"grace_ms,omitempty"`
}

// Pruned is what prune did.
type Pruned struct {
	Deleted  []ID `json:"deleted"`
	NDeleted int  `json:"checkpoints_deleted"`
	// Checkpoints describes each deleted checkpoint, for the text report.
	Checkpoints []RetentionEntry `json:"checkpoints"`
	GC          *GCReport        `json:"gc"`
	Kept        int              `json:"checkpoints_kept"`
	// Marked are checkpoints marked for deletion, each deleted by a later
	// prune, forget or gc after its delete_after unless a ref names it.
	Marked  []RetentionEntry `json:"marked"`
	NMarked int              `json:"checkpoints_marked"`
}

// GCRequest is POST /v1/gc.
type GCRequest struct {
	// GraceMS: never delete packs younger than this; absent: the default
	// (retention.DefaultGCGrace), 0: none kept for their age.
	GraceMS *int64 `json:"grace_ms,omitempty"`
	DryRun  bool   `json:"dry_run,omitempty"`
}

// InitRequest is POST /v1/init: a remote, a key file, or both.
type InitRequest struct {
	Remote  *RemoteConfig `json:"remote,omitempty"`
	KeyFile string        `json:"key_file,omitempty"`
	// EncryptLocal false, with KeyFile, keeps the local store and catalog
	// plaintext; only the remote store is sealed. Default (absent): true.
	EncryptLocal *bool `json:"encrypt_local,omitempty"`
}

// Initialised is what init did.
type Initialised struct {
	KeyID string `json:"key_id"`
	// IDs is the home's content ID scheme ("blake3" or "blake3-keyed");
	// EncryptLocal says whether the local store is sealed too.
	IDs          string `json:"ids"`
	EncryptLocal bool   `json:"encrypt_local"`
	Queued       int    `json:"objects_queued"`
	QueuedBytes  int64  `json:"bytes_queued"`
	Remote       string `json:"remote"`
}

// RebuildRequest is POST /v1/catalog/rebuild.
type RebuildRequest struct {
	// SkipCorrupt is the default now; it is still accepted.
	SkipCorrupt bool `json:"skip_corrupt,omitempty"`
	// Strict fails the rebuild at the first object it would skip.
	Strict bool `json:"strict,omitempty"`
}

// Rebuilt is what a catalog rebuild found.
type Rebuilt struct {
	Blobs       int             `json:"blobs"`
	Checkpoints int             `json:"checkpoints"`
	Corrupt     []CorruptObject `json:"corrupt"` // the skipped objects of class corrupt
	// Result is "complete", or "partial" when Skipped is not empty: the
	// catalog holds every whole sandbox and checkpoint, and the rest is
	// named in Skipped, each with its class (dangling, missing_objects,
	// corrupt).
	Result     string          `json:"result"`
	Skipped    []SkippedObject `json:"skipped"`
	DurationMS float64         `json:"duration_ms"`
	Packs      int             `json:"packs"`
	Refs       int             `json:"refs"`
	Sandboxes  int             `json:"sandboxes"`
}

// Rebuilt.Result values.
const (
	RebuildComplete = "complete"
	RebuildPartial  = "partial"
)

// ExecRequest is POST /v1/sandboxes/{name}/exec.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Detach starts a long-lived process and returns its pid at once.
	Detach bool `json:"detach,omitempty"`
	// Log (detached only) is a file inside the sandbox its output is
	// appended to.
	Log string `json:"log,omitempty"`
	// Stdin is the command's whole input. With StdinStream instead, the
	// request body continues after this JSON object with the raw input
	// bytes, read as the command runs.
	Stdin       []byte `json:"stdin,omitempty"`
	StdinStream bool   `json:"stdin_stream,omitempty"`
}

// Stdio is an exec's standard streams (nil: none): what a Go caller gives
// an exec, in process or through the client (which streams them).
type Stdio struct {
	In       io.Reader
	Out, Err io.Writer
}

// Exited ends an exec: the exit status, or for a detached exec the pid.
type Exited struct {
	Argv     []string `json:"started,omitempty"`
	ExitCode int      `json:"exit_code"`
	Log      string   `json:"log,omitempty"`
	PID      int      `json:"pid,omitempty"`
	Sandbox  string   `json:"sandbox"`
}
