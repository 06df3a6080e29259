package remote

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"
)

// LastPush summarises one push.
type LastPush struct {
	Finished    time.Time `json:"finished"`
	Uploaded    int       `json:"objects_uploaded"`
	Bytes       int64     `json:"bytes_uploaded"`
	BytesPerSec float64   `json:"bytes_per_sec"`
	Error       string    `json:"error,omitempty"`
}

func (e *Home) lastPushFile() string { return filepath.Join(e.d.Dir, "last-push.json") }

func (e *Home) saveLastPush(r *PushReport, err error) {
	lp := LastPush{Finished: time.Now().UTC(), Uploaded: r.Uploaded, Bytes: r.Bytes}
	if s := r.Duration.Seconds(); s > 0 {
		lp.BytesPerSec = float64(r.Bytes) / s
	}
	if err != nil {
		lp.Error = err.Error()
	}
	if data, err := json.Marshal(lp); err == nil {
		os.WriteFile(e.lastPushFile(), data, 0o600)
	}
}

// Unlock removes the bucket's stale lock objects, or with all every lock
// object (only when no push or gc runs on any host).
func (e *Home) Unlock(ctx context.Context, all bool) ([]LockInfo, error) {
	defer e.d.Shared()()
	if e.remote() == nil {
		return nil, ErrNoRemote
	}
	return e.Syncer().Unlock(ctx, all)
}

// LockWindow is the stale window this home's bucket locks state.
func (e *Home) LockWindow() time.Duration { return e.Syncer().StaleAfter() }

// Locks lists the bucket's lock objects.
func (e *Home) Locks(ctx context.Context) ([]LockInfo, error) {
	defer e.d.Shared()()
	if e.remote() == nil {
		return nil, ErrNoRemote
	}
	var out []LockInfo
	err := e.Syncer().ListLocks(ctx, func(li LockInfo) error { out = append(out, li); return nil })
	return out, err
}

// LastPush is the most recent push's outcome, nil before the first.
func (e *Home) LastPush() *LastPush {
	data, err := os.ReadFile(e.lastPushFile())
	if err != nil {
		return nil
	}
	var lp LastPush
	if json.Unmarshal(data, &lp) != nil {
		return nil
	}
	return &lp
}
