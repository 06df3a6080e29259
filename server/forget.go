package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// minForgetInterval keeps a typo (--forget-interval 1ms) from holding the
// engine's exclusive lock most of the time.
const minForgetInterval = 100 * time.Millisecond

// CheckForgetInterval refuses a --forget-interval under the minimum.
func CheckForgetInterval(d time.Duration) error {
	if d != 0 && d < minForgetInterval {
		return fmt.Errorf("serve: --forget-interval %s: want 0 (off) or at least %s: %w", d, minForgetInterval, errdefs.ErrInvalid)
	}
	return nil
}

// forgetOnSchedule applies the stored retention policies (policy set)
// every interval until ctx ends, as `policy apply` would, logging what
// each run deleted; the service's monitor counts it in
// turnsnap_forgotten_checkpoints_total. A run that started finishes even
// when ctx ends meanwhile (SIGTERM lets work in flight finish). The
// returned function waits for the loop to end.
func forgetOnSchedule(ctx context.Context, log *slog.Logger, svc *Service, interval time.Duration) (wait func()) {
	if interval <= 0 {
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			r, err := svc.ApplyPolicies(context.WithoutCancel(ctx), api.ApplyPoliciesRequest{})
			if err != nil {
				log.Error("scheduled forget failed", "err", err)
				continue
			}
			for _, s := range r.Sandboxes {
				if len(s.Deleted) == 0 {
					continue
				}
				ids := make([]string, len(s.Deleted))
				for i, d := range s.Deleted {
					ids[i] = d.ID.Short()
				}
				log.Info("scheduled forget deleted checkpoints", "sandbox", s.Sandbox, "deleted", len(s.Deleted),
					"kept", len(s.Kept), "checkpoints", ids)
			}
			if r.CheckpointsDeleted > 0 || r.CheckpointsMarked > 0 {
				// Marked: with a remote, deleted by a later run after the grace.
				log.Info("scheduled forget done", "deleted", r.CheckpointsDeleted, "marked", r.CheckpointsMarked,
					"kept", r.CheckpointsKept)
			}
		}
	}()
	return wg.Wait
}

// ForgetCheckpoint forgets the one checkpoint named by its full id (no
// prefix or tag: a deletion names exactly what it deletes), under the
// retention rules (retention.ForgetCheckpoint: heads, tags and branch
// points stay). graceMS is as ForgetRequest.GraceMS. The experimental
// snapshot provider's Delete calls it (package kube/snapshot).
func (s *Service) ForgetCheckpoint(ctx context.Context, id string, graceMS *int64) (*api.Forgotten, error) {
	cid, err := delta.ParseID(id)
	if err != nil || cid.String() != id {
		return nil, invalidf("checkpoint %q: not a full checkpoint id (64 lowercase hex digits)", id)
	}
	grace, err := recordGrace(graceMS, "forget checkpoint "+cid.Short())
	if err != nil {
		return nil, err
	}
	r, err := s.E.Retention().ForgetCheckpoint(ctx, cid, grace)
	if err != nil {
		return nil, err
	}
	return s.forgotten(ctx, r, false)
}
