package api

import (
	"context"
	"log/slog"
	"time"
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
// once. A home without a remote has no lease. renewed, if set, counts the
// writes that succeeded.
func RunLease(ctx context.Context, e leaseRenewer, ttl time.Duration, log *slog.Logger, renewed func()) {
	if !e.HasRemote() || ttl <= 0 {
		return
	}
	renew := func() {
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		defer cancel()
		if err := e.RenewLease(rctx, ttl); err != nil {
			if ctx.Err() == nil {
				log.Warn("host lease not renewed", "err", err)
			}
			return
		}
		if renewed != nil {
			renewed()
		}
	}
	renew()
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := e.ReleaseLease(rctx); err != nil {
				log.Warn("host lease not released", "err", err)
			}
			return
		case <-t.C:
			renew()
		}
	}
}
