package remote

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
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
//   - A lock is live for lockTTL after it was last written; holders rewrite
//     theirs every lockTTL/3, so a crashed host blocks nobody for long.
//
// With uploads and gc mutually excluded, a push can check that every pack
// a record needs is in the bucket just before the record goes up, and gc
// sees every record that was uploaded before it started.
const lockTTL = 10 * time.Minute

// Lock is a held lock object; Release deletes it.
type Lock struct {
	name    string
	stop    chan struct{}
	stopped chan struct{}
	store   upload.Store
}

// Lock takes a lock of kind "push" or "gc" in the remote store.
func (e *Syncer) Lock(ctx context.Context, kind string) (*Lock, error) {
	host, _ := os.Hostname()
	nonce := make([]byte, 6)
	rand.Read(nonce)
	name := fmt.Sprintf("%s%s-%s-%s", delta.LockPrefix, kind, sanitizeHost(host), hex.EncodeToString(nonce))
	body, _ := json.Marshal(delta.Lock{Kind: kind, Host: host, PID: os.Getpid(), Created: time.Now().UTC()})
	write := func(ctx context.Context) error { return upload.PutBytes(ctx, e.Remote, name, body) }
	if err := write(ctx); err != nil {
		return nil, fmt.Errorf("remote lock: %w", err)
	}
	var conflict string
	err := e.Remote.List(ctx, delta.LockPrefix, func(oi upload.ObjectInfo) error {
		if oi.Name == name || time.Since(oi.ModTime) > lockTTL {
			return nil
		}
		other := strings.TrimPrefix(oi.Name, delta.LockPrefix)
		if kind == "gc" || strings.HasPrefix(other, "gc-") {
			conflict = oi.Name
		}
		return nil
	})
	if err == nil && conflict != "" {
		err = fmt.Errorf("the bucket is locked by %s (a %s on another host or process); retry later: %w",
			conflict, map[bool]string{true: "garbage collection", false: "push"}[strings.HasPrefix(strings.TrimPrefix(conflict, delta.LockPrefix), "gc-")],
			errdefs.ErrUnavailable)
	}
	if err != nil {
		e.Remote.Delete(context.WithoutCancel(ctx), name)
		return nil, err
	}
	l := &Lock{name: name, stop: make(chan struct{}), stopped: make(chan struct{}), store: e.Remote}
	go func() { // keep the lock live while its holder works
		defer close(l.stopped)
		t := time.NewTicker(lockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				if err := write(context.Background()); err != nil {
					e.Log.Warn("remote lock refresh failed", "lock", name, "err", err)
				}
			}
		}
	}()
	return l, nil
}

// Release stops refreshing the lock and deletes it.
func (l *Lock) Release(ctx context.Context) {
	close(l.stop)
	<-l.stopped
	l.store.Delete(context.WithoutCancel(ctx), l.name)
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
