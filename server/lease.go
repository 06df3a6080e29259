package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/turnsnap/turnsnap/engine"
)

// leaseRenewer is what RunLease needs of the engine.
type leaseRenewer interface {
	HasRemote() bool
	RenewLease(ctx context.Context, ttl time.Duration) error
	ReleaseLease(ctx context.Context) error
}

// RunLease keeps this home's host lease in the bucket live while ctx lasts
// (docs/STORAGE.md, "Ownership and fencing"): written at once, then every
// ttl/3, so one failed renewal never lets it lapse; deleted when ctx ends
// (a clean shutdown), so another home may adopt this one's sandboxes at
// once. A home without a remote has no lease.
func RunLease(ctx context.Context, e leaseRenewer, ttl time.Duration, log *slog.Logger) {
	if !e.HasRemote() || ttl <= 0 {
		return
	}
	nowAndEvery(ctx, ttl/3, func() {
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		defer cancel()
		if err := e.RenewLease(rctx, ttl); err != nil && ctx.Err() == nil {
			log.Warn("host lease not renewed", "err", err)
		}
	})
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := e.ReleaseLease(rctx); err != nil {
		log.Warn("host lease not released", "err", err)
	}
}

// nowAndEvery calls fn at once and then every period until ctx ends.
func nowAndEvery(ctx context.Context, period time.Duration, fn func()) {
	fn()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// lockSweeper is what RunLockSweeper needs of the engine.
type lockSweeper interface {
	HasRemote() bool
	LockWindow() time.Duration
	Unlock(ctx context.Context, all bool) ([]engine.LockInfo, error)
}

// RunLockSweeper removes stale lock objects from the bucket at start and
// then every sixth of the lock window while ctx lasts: a push or gc killed
// on any host leaves its lock behind, ignored by everyone once stale but
// never removed by its dead holder; a live daemon clears it shortly after
// (docs/STORAGE.md, "Sharing a bucket"). Stale locks only: a live one is
// never touched.
func RunLockSweeper(ctx context.Context, e lockSweeper, log *slog.Logger) {
	if !e.HasRemote() {
		return
	}
	every := e.LockWindow() / 6
	if every <= 0 {
		return
	}
	nowAndEvery(ctx, every, func() {
		sctx, cancel := context.WithTimeout(ctx, every)
		defer cancel()
		removed, err := e.Unlock(sctx, false)
		if err != nil && ctx.Err() == nil {
			log.Debug("stale locks not swept", "err", err)
		}
		for _, l := range removed {
			log.Info("removed a stale bucket lock", "lock", l.Name, "holder_host", l.Host, "holder_pid", l.PID)
		}
	})
}
