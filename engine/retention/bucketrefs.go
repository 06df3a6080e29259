package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

// What is live, on a home with a remote, is computed from every ref in
// the bucket as well as this home's catalog (marks.go).

// bucketPins adds to pin every checkpoint a ref in the bucket names: every
// home's heads, every tag, and the origin of every sandbox description.
// A ref or description that cannot be read fails the call: retention that
// cannot see every ref deletes nothing. The objects are read
// bucketPinReaders at a time (a fleet's bucket holds one head and one
// description per sandbox, each a round trip).
func bucketPins(ctx context.Context, s upload.Store, pin Pins) error {
	return bucketRefs(ctx, s, pin, nil)
}

// bucketRefs is bucketPins that also gives, in owners (when not nil), the
// owner line of every head that has one, by sandbox key: a home whose
// sandbox another home adopted must stop pruning it even before it learns
// of the adoption by a fenced push.
func bucketRefs(ctx context.Context, s upload.Store, pin Pins, owners map[string]delta.Owner) error {
	var names []string
	for _, prefix := range []string{delta.HeadPrefix, delta.TagPrefix, delta.SandboxPrefix} {
		err := s.List(ctx, prefix, func(oi upload.ObjectInfo) error { names = append(names, oi.Name); return nil })
		if err != nil {
			return fmt.Errorf("list the bucket's %s: %w", prefix, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var firstErr error
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(bucketPinReaders, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				id, why, owner, err := readPin(ctx, s, name)
				mu.Lock()
				switch {
				case err != nil && firstErr == nil:
					firstErr = err
					cancel()
				case err == nil && !id.IsZero():
					pin.Add(id, why)
					if owners != nil && !owner.IsZero() {
						owners[strings.TrimPrefix(name, delta.HeadPrefix)] = owner
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		work <- name
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("read the bucket's refs: %w", firstErr)
	}
	return ctx.Err()
}

// bucketPinReaders bounds the ref reads of bucketPins in flight.
const bucketPinReaders = 8

// readPin reads one head, tag or sandbox description: the checkpoint it
// names (zero for none: a description made from a base, or an object
// removed since the listing) and why it pins it.
func readPin(ctx context.Context, s upload.Store, name string) (delta.ID, string, delta.Owner, error) {
	limit := int64(delta.MaxSmallObject)
	if strings.HasPrefix(name, delta.SandboxPrefix) {
		limit = delta.MaxSandboxObject
	}
	data, err := upload.ReadAllMax(ctx, s, name, limit)
	if errors.Is(err, errdefs.ErrNotFound) {
		return delta.ID{}, "", delta.Owner{}, nil // removed since the listing: it names nothing now
	}
	if err != nil {
		return delta.ID{}, "", delta.Owner{}, fmt.Errorf("object %s: %w", name, err)
	}
	if key, ok := strings.CutPrefix(name, delta.SandboxPrefix); ok {
		sb, err := delta.DecodeSandbox(name, data)
		if err != nil {
			return delta.ID{}, "", delta.Owner{}, err // names the object
		}
		return sb.Origin, "branched: " + string(sb.Name) + " (" + key + ")", delta.Owner{}, nil
	}
	id, owner, err := delta.ParseHead(data)
	if err != nil {
		return delta.ID{}, "", delta.Owner{}, fmt.Errorf("object %s: %w", name, err)
	}
	if tag, ok := strings.CutPrefix(name, delta.TagPrefix); ok {
		return id, "tag " + tag, delta.Owner{}, nil
	}
	return id, "head in the bucket: " + strings.TrimPrefix(name, delta.HeadPrefix), owner, nil
}

// addBucketPins pins, in h, what the bucket's refs name and this catalog
// does not already pin (this home's own reasons read better).
func (o *op) addBucketPins(ctx context.Context, h *History) error {
	if o.Remote == nil {
		return nil
	}
	b := Pins{}
	owners := map[string]delta.Owner{}
	if err := bucketRefs(ctx, o.Remote, b, owners); err != nil {
		return err
	}
	for id, why := range b {
		if len(h.Pin[id]) == 0 {
			h.Pin[id] = why
		}
	}
	// The bucket's head says who owns a sandbox now: this home's catalog
	// may not know yet that another home adopted one of its sandboxes.
	for key, ow := range owners {
		if ow.Home != o.HomeID && h.Owned[key] {
			h.Owned[key] = false
		}
	}
	return nil
}
