// Package upload owns where checkpoint objects live and how they get there:
// the Store interface and its implementations (a local directory, an
// S3-compatible bucket), and the wrappers that add retries, tiering, fault
// injection and scheduling around a Store. It moves bytes only; what the
// bytes mean (packs, records, names) is package delta's.
package upload

import (
	"context"
	"io"
	"time"
)

// Store holds named, immutable-once-written objects.
//
// Contract, which every implementation passes in storetest:
//   - Names are slash-separated relative paths of [A-Za-z0-9._-] components
//     ("packs/ab/abcd...", "records/..."); anything else is ErrInvalid.
//   - Put is atomic and durable: when it returns nil, the whole object is
//     readable by every later Get, on this host and after a crash; when it
//     fails or the process dies, no reader ever sees a partial object.
//     Putting a name that exists replaces it atomically (only mutable
//     objects, such as refs, are ever written twice; content-addressed
//     objects are written once and never modified).
//   - Get of a missing name returns an error wrapping errdefs.ErrNotFound.
//     Stores do not verify content: callers hash what they read.
//   - List calls fn for every object whose name starts with prefix, in
//     lexical order of name; an error from fn stops the listing and is returned.
//   - Delete of a missing name is not an error.
type Store interface {
	Put(ctx context.Context, name string, r io.Reader, size int64) error
	Get(ctx context.Context, name string) (io.ReadCloser, error)
	Stat(ctx context.Context, name string) (ObjectInfo, error)
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	Delete(ctx context.Context, name string) error
}

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Name    string
	Size    int64
	ModTime time.Time
}

// RangeGetter is an optional fast path: stores that can read part of an
// object without fetching all of it implement it. Use GetRange, which falls
// back to Get for stores that do not.
type RangeGetter interface {
	GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error)
}
