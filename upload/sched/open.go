package sched

import (
	"context"
	"io"

	"github.com/turnsnap/turnsnap/upload"
)

// FromStore returns an Upload.Open that reads name from s: the usual body
// of an upload, an object already durable in the local store (whose Get
// gives an *os.File, which retries can rewind). ctx bounds the reads.
func FromStore(ctx context.Context, s upload.Store, name string) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return s.Get(ctx, name) }
}
