package upload

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// ErrConditionFailed is what a conditional write returns when the object is
// not in the state the writer last saw: another writer got there first
// (HTTP 412 on S3). It is a failed precondition, never retried.
var ErrConditionFailed = fmt.Errorf("the object changed since this host last read it (conditional write refused): %w", errdefs.ErrPrecondition)

// Conditional is the optional interface of stores that write an object only
// if it is in the state the writer last saw: S3's If-Match on the ETag and
// If-None-Match: * for creation. Ownership of a sandbox on a shared bucket
// (docs/STORAGE.md, "Ownership and fencing") stands on it: a remote
// without it is refused for anything that writes a head.
//
// Contract:
//   - GetVersion reads a whole small object (at most max bytes, else
//     ErrCorrupt) and its version tag, an opaque string that changes
//     whenever the object is written (on S3 the ETag; every write of the
//     objects this is used for has different bytes).
//   - PutIf stores data at name only if the object's version tag is match,
//     or, with match "", only if no object has the name. It returns the new
//     version tag. A refused write wraps ErrConditionFailed and changes
//     nothing; a write whose outcome is unknown (a lost answer) is
//     ErrUnavailable, and the caller reads the object to learn it.
type Conditional interface {
	GetVersion(ctx context.Context, name string, max int64) (data []byte, version string, err error)
	PutIf(ctx context.Context, name string, data []byte, match string) (version string, err error)
}

// AsConditional returns s's conditional writes, or an error naming what the
// store lacks.
func AsConditional(s Store) (Conditional, error) {
	if c, ok := s.(Conditional); ok {
		return c, nil
	}
	return nil, fmt.Errorf("the remote store does not support conditional writes (If-Match / If-None-Match), which sharing a bucket between hosts needs: %w", errdefs.ErrPrecondition)
}

// retryStore: a PutIf whose answer was lost may have been applied; its
// retry is then refused by its own write. The object is read back, and if
// it holds exactly our bytes the write was ours.
func (r *retryStore) GetVersion(ctx context.Context, name string, max int64) ([]byte, string, error) {
	c, err := AsConditional(r.inner)
	if err != nil {
		return nil, "", err
	}
	var data []byte
	var v string
	err = r.do(ctx, OpGet, "object "+name, func() (err error) {
		data, v, err = c.GetVersion(ctx, name, max)
		return err
	})
	return data, v, err
}

func (r *retryStore) PutIf(ctx context.Context, name string, data []byte, match string) (string, error) {
	c, err := AsConditional(r.inner)
	if err != nil {
		return "", err
	}
	var v string
	tries := 0
	err = r.do(ctx, OpPut, "object "+name, func() (err error) {
		tries++
		v, err = c.PutIf(ctx, name, data, match)
		if tries > 1 && errors.Is(err, ErrConditionFailed) {
			got, gv, gerr := c.GetVersion(ctx, name, int64(len(data)))
			if gerr == nil && bytes.Equal(got, data) {
				v = gv
				return nil // an earlier attempt stored it
			}
		}
		return err
	})
	return v, err
}

func (z sealed) GetVersion(ctx context.Context, name string, max int64) ([]byte, string, error) {
	c, err := AsConditional(z.s)
	if err != nil {
		return nil, "", err
	}
	if z.k == nil {
		data, v, err := c.GetVersion(ctx, name, max)
		if err == nil && delta.SealedName(name) && delta.IsSealedObject(data) {
			return nil, "", errNoKey(name)
		}
		return data, v, err
	}
	if !delta.SealedName(name) {
		return c.GetVersion(ctx, name, max)
	}
	data, v, err := c.GetVersion(ctx, name, max+sealedOverhead)
	if err != nil {
		return nil, "", err
	}
	plain, err := z.k.OpenObject(name, data)
	return plain, v, err
}

func (z sealed) PutIf(ctx context.Context, name string, data []byte, match string) (string, error) {
	c, err := AsConditional(z.s)
	if err != nil {
		return "", err
	}
	if z.k != nil && delta.SealedName(name) {
		data = z.k.SealObject(name, data)
	}
	return c.PutIf(ctx, name, data, match)
}
