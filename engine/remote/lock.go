package remote

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// Remote lock objects keep garbage collection from running while any host
// uploads (and the reverse). Hosts sharing a bucket share nothing else, so
// the bucket itself carries the protocol (docs/STORAGE.md, "Sharing a
// bucket"):
//
//   - A push writes locks/push-<host>-<nonce>, a gc writes
//     locks/gc-<host>-<nonce>, and then each lists locks/. A gc that sees
//     any other live lock, or a push that sees a live gc lock, deletes its
//     own and backs off. Because each writes before it looks, two that race
//     see each other and at least one backs off: a gc and a push never run
//     together. Pushes do not exclude each other.
//   - A lock carries its holder's clock and promise (delta.Lock): it is
//     rewritten every StaleAfter/3 and is stale once not rewritten for
//     StaleAfter. A killed holder blocks nobody for longer than that, and
//     `turnsnap unlock` removes a stale lock at once.
//   - A holder that has not managed to refresh for StaleAfter - a margin
//     cancels its own operation (Lock.Context): others may take its lock
//     for stale, and it must not go on deleting or uploading as if it
//     still held it.
//
// With uploads and gc mutually excluded, a push can check that every pack
// a record needs is in the bucket just before the record goes up, and gc
// sees every record that was uploaded before it started.

// Lock is a held lock object; Release deletes it.
type Lock struct {
	name    string
	store   upload.Store
	stop    chan struct{}
	stopped chan struct{}
	lost    chan struct{} // closed when the holder can no longer vouch for it
	lostErr error
	once    sync.Once
}

// staleAfter is the window this syncer's locks promise.
func (e *Syncer) staleAfter() time.Duration {
	if e.LockStaleAfter > 0 {
		return e.LockStaleAfter
	}
	return delta.DefaultLockStaleAfter
}

// Lock takes a lock of kind "push" or "gc" in the remote store.
func (e *Syncer) Lock(ctx context.Context, kind string) (*Lock, error) {
	host, _ := os.Hostname()
	nonce := make([]byte, 6)
	rand.Read(nonce)
	name := fmt.Sprintf("%s%s-%s-%s", delta.LockPrefix, kind, sanitizeHost(host), hex.EncodeToString(nonce))
	window := e.staleAfter()
	body := delta.Lock{Kind: kind, Host: host, PID: os.Getpid(), Home: e.HomeID, Created: time.Now().UTC(), StaleAfterNs: int64(window)}
	write := func(ctx context.Context) error {
		body.Refreshed = time.Now().UTC()
		data, _ := json.Marshal(body)
		return upload.PutBytes(ctx, e.Remote, name, data)
	}
	if err := write(ctx); err != nil {
		return nil, fmt.Errorf("remote lock: %w", err)
	}
	var conflict *LockInfo
	err := e.ListLocks(ctx, func(li LockInfo) error {
		if li.Name == name || li.Stale {
			return nil
		}
		if kind == "gc" || li.Kind == "gc" {
			conflict = &li
		}
		return nil
	})
	if err == nil && conflict != nil {
		what := map[bool]string{true: "garbage collection", false: "push"}[conflict.Kind == "gc"]
		err = fmt.Errorf("the bucket is locked by %s (a %s by %s pid %d, refreshed %s ago; stale after %s without refresh, or `turnsnap unlock` if it is gone); retry later: %w",
			conflict.Name, what, conflict.Host, conflict.PID, time.Since(conflict.Refreshed).Round(time.Second),
			conflict.StaleAfter, errdefs.ErrUnavailable)
	}
	if err != nil {
		e.Remote.Delete(context.WithoutCancel(ctx), name)
		return nil, err
	}
	l := &Lock{name: name, store: e.Remote, stop: make(chan struct{}), stopped: make(chan struct{}), lost: make(chan struct{})}
	go func() { // keep the lock live while its holder works
		defer close(l.stopped)
		t := time.NewTicker(window / 3)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(context.Background(), window/3)
				err := write(rctx)
				cancel()
				if err == nil {
					last = time.Now()
					continue
				}
				e.Log.Warn("remote lock refresh failed", "lock", name, "err", err)
				// Give up while others still see the lock live: past
				// two thirds of the window without a refresh.
				if time.Since(last) >= window*2/3 {
					l.once.Do(func() {
						l.lostErr = fmt.Errorf("remote lock %s not refreshed for %s (%v); stopping before other hosts take it for stale: %w",
							name, time.Since(last).Round(time.Millisecond), err, errdefs.ErrUnavailable)
						close(l.lost)
					})
					return
				}
			}
		}
	}()
	return l, nil
}

// Context returns a context that is cancelled when the lock is lost (its
// refreshes failed for too long) or the returned cancel is called. Work
// done under the lock must use it.
func (l *Lock) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		select {
		case <-l.lost:
			cancel(l.lostErr)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// Err is why the lock was lost, or nil.
func (l *Lock) Err() error {
	select {
	case <-l.lost:
		return l.lostErr
	default:
		return nil
	}
}

// Release stops refreshing the lock and deletes it.
func (l *Lock) Release(ctx context.Context) {
	close(l.stop)
	<-l.stopped
	l.store.Delete(context.WithoutCancel(ctx), l.name)
}

// LockInfo is one lock object as another host sees it.
type LockInfo struct {
	Name string `json:"name"`
	delta.Lock
	Refreshed  time.Time     `json:"refreshed"`
	StaleAfter time.Duration `json:"stale_after_ns"`
	Stale      bool          `json:"stale"`
	// Unreadable locks (damaged, or from an unknown writer) are judged by
	// modification time alone.
	Unreadable bool `json:"unreadable,omitempty"`
}

// ListLocks calls fn for each lock object in the bucket, judged now.
func (e *Syncer) ListLocks(ctx context.Context, fn func(LockInfo) error) error {
	if e.Remote == nil {
		return ErrNoRemote
	}
	now := time.Now()
	var infos []LockInfo
	err := e.Remote.List(ctx, delta.LockPrefix, func(oi upload.ObjectInfo) error {
		li := LockInfo{Name: oi.Name}
		li.Kind, _, _ = strings.Cut(strings.TrimPrefix(oi.Name, delta.LockPrefix), "-")
		li.Refreshed = oi.ModTime
		infos = append(infos, li)
		return nil
	})
	if err != nil {
		return fmt.Errorf("remote locks: %w", err)
	}
	for _, li := range infos {
		mod := li.Refreshed
		data, err := upload.ReadAll(ctx, e.Remote, li.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // released since the listing
		}
		if err != nil {
			return fmt.Errorf("remote lock %s: %w", li.Name, err)
		}
		var body delta.Lock
		if len(data) > 64<<10 || json.Unmarshal(data, &body) != nil {
			li.Unreadable = true
		} else {
			kind := li.Kind
			li.Lock = body
			li.Kind = kind // the name decides: it is what every host lists
			if body.Refreshed.After(li.Refreshed) {
				li.Refreshed = body.Refreshed
			}
		}
		li.StaleAfter = time.Duration(li.StaleAfterNs)
		if li.StaleAfter <= 0 {
			li.StaleAfter = delta.DefaultLockStaleAfter
		}
		li.Stale = body.Stale(mod, now)
		if err := fn(li); err != nil {
			return err
		}
	}
	return nil
}

// Unlock removes lock objects from the bucket: stale ones only, or with
// all every one (a lock of a live operation too: its holder then works
// unprotected, so only when no operation is running). It returns the
// locks removed.
func (e *Syncer) Unlock(ctx context.Context, all bool) ([]LockInfo, error) {
	var removed []LockInfo
	err := e.ListLocks(ctx, func(li LockInfo) error {
		if !all && !li.Stale {
			return nil
		}
		if err := e.Remote.Delete(ctx, li.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("remove lock %s: %w", li.Name, err)
		}
		removed = append(removed, li)
		return nil
	})
	return removed, err
}

func sanitizeHost(h string) string {
	var b strings.Builder
	for _, c := range h {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' {
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		return "host"
	}
	return b.String()
}
