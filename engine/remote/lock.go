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
	"github.com/turnsnap/turnsnap/proc"
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
//     StaleAfter (a minute by default). A killed holder blocks other
//     machines for no longer than that, and `turnsnap unlock` removes a
//     stale lock at once.
//   - A lock also names its holder's machine (hostname, boot id, pid
//     namespace) and process (pid and start time). On that machine a lock
//     whose holder has ended is stale at once: a killed gc does not block
//     its own host's pushes at all.
//   - A holder that has not managed to refresh for 2/3 of StaleAfter
//     cancels its own operation (Lock.Context): others may soon take its
//     lock for stale, and it must not go on deleting or uploading as if it
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

// StaleAfter is the window this syncer's locks promise.
func (e *Syncer) StaleAfter() time.Duration { return e.staleAfter() }

// staleAfter is the window this syncer's locks promise.
func (e *Syncer) staleAfter() time.Duration {
	if e.LockStaleAfter > 0 {
		return e.LockStaleAfter
	}
	return delta.DefaultLockStaleAfter
}

// machine is where a lock's holder runs, as far as its pid means the same
// process: the hostname, the boot (a pid names another process after a
// reboot) and the pid namespace (containers sharing the kernel's boot id).
type machine struct {
	host, bootID, pidNS string
}

// thisMachine is the calling process's machine. Without /proc its boot id
// is empty: its locks are then judged by their clock alone, and it judges
// every other lock so.
func thisMachine() machine {
	m := machine{}
	m.host, _ = os.Hostname()
	boot, err1 := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, err2 := os.Readlink("/proc/self/ns/pid")
	if err1 == nil && err2 == nil {
		m.bootID, m.pidNS = strings.TrimSpace(string(boot)), ns
	}
	return m
}

// runs reports whether l's holder runs on m, so that its PID names a
// process m can look at. Locks that name no boot id (written by older
// versions, or by a holder without /proc) never do.
func (m machine) runs(l *delta.Lock) bool {
	return m.bootID != "" && l.BootID == m.bootID && l.PIDNS == m.pidNS && l.Host == m.host
}

// judge decides whether lock l, whose object the store last modified at
// mod, is stale at now as seen from here: by its clock, as every machine
// judges, or because it names a holder on this machine that has certainly
// ended (gone), which no refresh can follow.
func judge(l *delta.Lock, mod, now time.Time, here machine) (stale, gone bool) {
	gone = here.runs(l) && proc.Holder{PID: l.PID, Start: l.PIDStart}.Gone()
	return gone || l.Stale(mod, now), gone
}

// Lock takes a lock of kind "push" or "gc" in the remote store.
func (e *Syncer) Lock(ctx context.Context, kind string) (*Lock, error) {
	here := thisMachine()
	self := proc.Self()
	nonce := make([]byte, 6)
	rand.Read(nonce)
	name := fmt.Sprintf("%s%s-%s-%s", delta.LockPrefix, kind, sanitizeHost(here.host), hex.EncodeToString(nonce))
	window := e.staleAfter()
	body := delta.Lock{Kind: kind, Host: here.host, PID: self.PID, Home: e.HomeID, Created: time.Now().UTC(), StaleAfterNs: int64(window),
		BootID: here.bootID, PIDNS: here.pidNS, PIDStart: self.Start}
	// write refreshes the lock, stamped with when it started: others
	// judge by the stamp, so it is what the holder's own deadline counts
	// from.
	write := func(ctx context.Context) (time.Time, error) {
		start := time.Now()
		body.Refreshed = start.UTC()
		data, _ := json.Marshal(body)
		return start, upload.PutBytes(ctx, e.Remote, name, data)
	}
	last, err := write(ctx)
	if err != nil {
		return nil, fmt.Errorf("remote lock: %w", err)
	}
	var conflict *LockInfo
	err = e.ListLocks(ctx, func(li LockInfo) error {
		if li.Name == name {
			return nil
		}
		if li.Stale {
			// Its holder is gone or has stopped itself (a holder that
			// cannot refresh cancels first): the object is litter that
			// would otherwise stay until someone ran unlock.
			if err := e.Remote.Delete(ctx, li.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				e.Log.Warn("stale remote lock not removed", "lock", li.Name, "err", err)
			}
			return nil
		}
		if kind == "gc" || li.Kind == "gc" {
			conflict = &li
		}
		return nil
	})
	if err == nil && conflict != nil {
		err = fmt.Errorf("the bucket is locked by %s; retry later: %w", conflict.describe(time.Now()), errdefs.ErrUnavailable)
	}
	if err != nil {
		e.Remote.Delete(context.WithoutCancel(ctx), name)
		return nil, err
	}
	l := &Lock{name: name, store: e.Remote, stop: make(chan struct{}), stopped: make(chan struct{}), lost: make(chan struct{})}
	go func() { // keep the lock live while its holder works
		defer close(l.stopped)
		t := time.NewTimer(window / 3)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
			}
			// Give up while others still see the lock live: two thirds
			// of the window after the last refresh, however slow the
			// store answers meanwhile.
			giveUp := last.Add(window * 2 / 3)
			rctx, cancel := context.WithDeadline(context.Background(), giveUp)
			start, err := write(rctx)
			cancel()
			if err == nil {
				last = start
				t.Reset(window / 3)
				continue
			}
			if !time.Now().Before(giveUp) {
				l.once.Do(func() {
					l.lostErr = fmt.Errorf("remote lock %s not refreshed for %s (%v); stopping before other hosts take it for stale: %w",
						name, time.Since(last).Round(time.Millisecond), err, errdefs.ErrUnavailable)
					close(l.lost)
				})
				return
			}
			// Retry soon: one failed refresh must not cost the lock.
			e.Log.Warn("remote lock refresh failed", "lock", name, "err", err)
			t.Reset(min(window/12, time.Until(giveUp)))
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
	// HolderGone: the lock names a holder on this machine that has ended
	// (so it is stale whatever its clock says).
	HolderGone bool `json:"holder_gone,omitempty"`
	// Unreadable locks (damaged, or from an unknown writer) are judged by
	// modification time alone, with delta.LegacyLockStaleAfter.
	Unreadable bool `json:"unreadable,omitempty"`
}

// describe names the lock and its holder for an error, with how long until
// it goes stale by its clock (at now).
func (li *LockInfo) describe(now time.Time) string {
	left := max(li.Refreshed.Add(li.StaleAfter).Sub(now), 0).Round(time.Second)
	if li.Unreadable {
		return fmt.Sprintf("%s (unreadable, written %s ago): stale in %s; if no push or gc runs on any host, `turnsnap unlock --all` removes it now",
			li.Name, now.Sub(li.Refreshed).Round(time.Second), left)
	}
	what := map[bool]string{true: "garbage collection", false: "push"}[li.Kind == "gc"]
	return fmt.Sprintf("%s (a %s by host %s pid %d, refreshed %s ago): stale in %s, or now if its holder is gone: `turnsnap unlock`",
		li.Name, what, li.Host, li.PID, now.Sub(li.Refreshed).Round(time.Second), left)
}

// ListLocks calls fn for each lock object in the bucket, judged now.
func (e *Syncer) ListLocks(ctx context.Context, fn func(LockInfo) error) error {
	if e.Remote == nil {
		return ErrNoRemote
	}
	now, here := time.Now(), thisMachine()
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
		li.StaleAfter = body.Window()
		li.Stale, li.HolderGone = judge(&body, mod, now, here)
		if err := fn(li); err != nil {
			return err
		}
	}
	return nil
}

// Unlock removes lock objects from the bucket: stale ones only (those
// whose holder on this machine has ended included), or with all every one
// (a lock of a live operation too: its holder then works unprotected, so
// only when no operation is running). It returns the locks removed.
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
