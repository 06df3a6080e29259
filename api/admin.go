package api

import "time"

// StatusReport is the state of this home's remote durability.
//
// The wire form of engine.StatusReport.
type StatusReport struct {
	Remote       string          `json:"remote"` // "" without a remote
	QueueDepth   int             `json:"objects_pending"`
	PendingBytes int64           `json:"bytes_pending"`
	Sandboxes    []SandboxStatus `json:"sandboxes"`
	// LastPush is the most recent push's outcome; uploads run only during
	// `sync` and `checkpoint --wait-remote`, so its rate is the upload rate.
	LastPush *LastPush `json:"last_push,omitempty"`
}

// GCReport says what GC found and did.
//
// The wire form of engine.GCReport.
type GCReport struct {
	Records        int     `json:"records"`
	RecordsSwept   int     `json:"records_swept"` // this home's marked records deleted first (their grace is over)
	LiveBlobs      int     `json:"blobs_live"`
	Packs          int     `json:"packs"`
	Deleted        int     `json:"packs_deleted"`
	DeletedBytes   int64   `json:"bytes_deleted"`
	KeptYoung      int     `json:"packs_kept_young"`
	PartlyLive     int     `json:"packs_partly_live"`
	DeadBytesKept  int64   `json:"bytes_dead_kept"`
	DryRun         bool    `json:"dry_run"`
	DurationMillis float64 `json:"duration_ms"` // milliseconds, as every command's duration_ms
}

// RemoteConfig names an S3-compatible bucket and how uploads to it are paced.
//
// The wire form of engine.RemoteConfig.
type RemoteConfig struct {
	URL      string `json:"url"`      // s3://BUCKET[/PREFIX]
	Endpoint string `json:"endpoint"` // HOST:PORT
	Region   string `json:"region,omitempty"`
	Insecure bool   `json:"insecure,omitempty"` // plain HTTP (loopback, trusted networks)
	CAFile   string `json:"ca_file,omitempty"`
	// BandwidthBytes caps this host's upload rate (bytes/s); 0 = no cap.
	BandwidthBytes int64 `json:"bandwidth_bytes_per_sec,omitempty"`
	// Concurrency is how many uploads run at once; 0 = DefaultUploadConcurrency.
	Concurrency int `json:"concurrency,omitempty"`
	// LockStaleAfterNs is the stale window this home's bucket locks state
	// (docs/STORAGE.md): it refreshes them every third of it, and another
	// host ignores one not refreshed for that long. 0 =
	// delta.DefaultLockStaleAfter (1 minute).
	LockStaleAfterNs int64 `json:"lock_stale_after_ns,omitempty"`
}

// CorruptObject is an object a rebuild could not use.
//
// The wire form of engine.CorruptObject.
type CorruptObject struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

// SkippedObject is one object a rebuild left out.
//
// The wire form of engine.SkippedObject.
type SkippedObject struct {
	Name  string    `json:"name"` // the store object, as named in the store
	Class SkipClass `json:"class"`
	// Sandbox is the label (on the home that wrote it) of the sandbox the
	// object belongs to, when the rebuild could tell.
	Sandbox string `json:"sandbox,omitempty"`
	Error   string `json:"error"`
}

// SandboxStatus is one sandbox's share of the upload queue.
//
// The wire form of engine.SandboxStatus.
type SandboxStatus struct {
	Sandbox        string `json:"sandbox"`
	PendingObjects int    `json:"objects_pending"`
	PendingBytes   int64  `json:"bytes_pending"`
	// StoredBytes is what the sandbox's checkpoints added to the store in
	// all, the scale against which PendingBytes is progress.
	StoredBytes int64 `json:"bytes_stored"`
	// Checkpoints not yet remotely durable (their record is queued), of
	// Checkpoints in all: the share that is durable is the upload progress
	// that matters (a checkpoint is remotely durable once its record is).
	PendingCheckpoints int `json:"checkpoints_pending"`
	Checkpoints        int `json:"checkpoints"`
	// RemoteDurable is true only when nothing the sandbox needs is still
	// queued: none of its own objects (records, description, head ref) and
	// not the record its head names, which may be another sandbox's (a
	// branch, or a rollback to another sandbox's checkpoint).
	RemoteDurable bool `json:"remote_durable"`
	// WaitsFor names the other sandboxes whose queued uploads this one's
	// head needs.
	WaitsFor []string `json:"waits_for,omitempty"`
	// Interrupted is what an interrupted operation left on the sandbox
	// (engine/intent): a pending rollback, processes not restored.
	Interrupted *Interrupted `json:"interrupted,omitempty"`
}

// LastPush summarises one push.
//
// The wire form of engine.LastPush.
type LastPush struct {
	Finished    time.Time `json:"finished"`
	Uploaded    int       `json:"objects_uploaded"`
	Bytes       int64     `json:"bytes_uploaded"`
	BytesPerSec float64   `json:"bytes_per_sec"`
	Error       string    `json:"error,omitempty"`
}

// SkipClass is why a rebuild left an object out.
//
// The wire form of engine.SkipClass.
type SkipClass string

// The skip classes (engine.SkipDangling ...).
const (
	// SkipDangling: a head or tag names a checkpoint the store lacks.
	SkipDangling SkipClass = "dangling"
	// SkipMissingObjects: something the object needs is in no pack.
	SkipMissingObjects SkipClass = "missing_objects"
	// SkipCorrupt: the object does not decode or breaks a rule of the
	// format.
	SkipCorrupt SkipClass = "corrupt"
)
