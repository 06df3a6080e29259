package upload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func (s *s3Store) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	return s.open(ctx, &s3Body{s: s, name: name, end: -1})
}

// GetRange reads length bytes at offset with one ranged GET, or fewer if
// the object ends first.
func (s *s3Store) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if offset < 0 || length < 0 {
		return nil, fmt.Errorf("object %s: bad range %d+%d: %w", name, offset, length, errdefs.ErrInvalid)
	}
	end := int64(-1) // to the end of the object
	if length <= math.MaxInt64-offset {
		end = offset + length
	}
	b := &s3Body{s: s, name: name, start: offset, end: end}
	if length == 0 {
		// HTTP cannot ask for no bytes; the object must still exist.
		if _, err := s.Stat(ctx, name); err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	return s.open(ctx, b)
}

// s3Body is the body of one GET. It remembers the object's ETag and how far
// it got, so Resume can continue a broken read from the same version.
type s3Body struct {
	s     *s3Store
	name  string
	etag  string // "" until the first response
	start int64  // object offset of this body's first byte
	end   int64  // object offset after the last byte wanted, or -1 for the end
	size  int64  // the object's size, from the first response
	read  int64  // bytes returned so far
	rc    io.ReadCloser
}

// open sends the GET for what b has not read yet, pinned to b's ETag once
// it has one, and returns b ready to read.
func (s *s3Store) open(ctx context.Context, b *s3Body) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("object %s: %w", b.name, err)
	}
	off := b.start + b.read
	if b.etag != "" && (off >= b.size || b.end >= 0 && off >= b.end) {
		b.rc = io.NopCloser(strings.NewReader(""))
		return b, nil
	}
	var opts minio.GetObjectOptions
	if b.etag != "" {
		_ = opts.SetMatchETag(b.etag) // only fails on an empty tag
	}
	switch {
	case b.end >= 0:
		_ = opts.SetRange(off, b.end-1) // off < end, so always valid
	case off > 0:
		_ = opts.SetRange(off, 0)
	}
	rc, info, hdr, err := s.core.GetObject(ctx, s.bucket, s.key(b.name), opts)
	if err != nil {
		if isS3Code(err, "InvalidRange") {
			// The range starts at or past the end: no bytes, but the
			// object exists (a missing one is NoSuchKey).
			return io.NopCloser(strings.NewReader("")), nil
		}
		if isS3Code(err, "PreconditionFailed") {
			return nil, fmt.Errorf("object %s: replaced while being read: %w", b.name, errdefs.ErrPrecondition)
		}
		return nil, s3Err(ctx, "object "+b.name, err)
	}
	if b.etag == "" {
		b.etag = info.ETag
		b.size = objectSize(info.Size, hdr.Get("Content-Range"))
	}
	if info.Size <= smallBody {
		// Read it whole now: a failure midway is then a failure of this
		// call, which WithRetry repeats from the start of the current
		// version, rather than a broken read that can only resume if the
		// object has not been replaced meanwhile.
		data, err := io.ReadAll(rc)
		rc.Close()
		if err == nil && int64(len(data)) != info.Size {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, fmt.Errorf("object %s: %w: %w", b.name, errdefs.ErrUnavailable, err)
		}
		rc = io.NopCloser(bytes.NewReader(data))
	}
	b.rc = rc
	return b, nil
}

// smallBody is the largest response body open reads whole before
// returning. Every mutable object turnsnap writes (refs, sandbox metadata)
// is far smaller, so their reads never resume across versions; packs, which
// never change, stream.
const smallBody = 1 << 20

// objectSize is the whole object's size: for a ranged GET the response's
// Content-Length is only the range, and the total is in Content-Range.
func objectSize(length int64, contentRange string) int64 {
	if cr := contentRange; cr != "" {
		var first, last, total int64
		if _, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &first, &last, &total); err == nil {
			return total
		}
	}
	return length
}

func (b *s3Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.read += int64(n)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("object %s: reading at offset %d: %w: %w", b.name, b.start+b.read, errdefs.ErrUnavailable, err)
	}
	return n, err
}

func (b *s3Body) Close() error { return b.rc.Close() }

// Resume implements Resumer: a new GET for the bytes not yet read, which
// fails with ErrPrecondition if the object has been replaced since.
func (b *s3Body) Resume(ctx context.Context) (io.ReadCloser, error) {
	b.rc.Close()
	next := *b
	next.start, next.read, next.rc = b.start+b.read, 0, nil
	return b.s.open(ctx, &next)
}

func (s *s3Store) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if err := CheckName(name); err != nil {
		return ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return ObjectInfo{}, fmt.Errorf("object %s: %w", name, err)
	}
	info, err := s.client.StatObject(ctx, s.bucket, s.key(name), minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s3Err(ctx, "object "+name, err)
	}
	return ObjectInfo{Name: name, Size: info.Size, ModTime: info.LastModified}, nil
}

// List relies on S3 listing keys in UTF-8 binary order, which is the
// lexical order of names under one prefix. Keys under the prefix that are
// not valid object names were not written by a Store and are skipped.
func (s *s3Store) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	what := fmt.Sprintf("list %q", prefix)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	opts := minio.ListObjectsOptions{Prefix: s.key(prefix), Recursive: true}
	for obj := range s.client.ListObjectsIter(ctx, s.bucket, opts) {
		if obj.Err != nil {
			return s3Err(ctx, what, obj.Err)
		}
		name := strings.TrimPrefix(obj.Key, s.prefix)
		if CheckName(name) != nil {
			continue
		}
		if err := fn(ObjectInfo{Name: name, Size: obj.Size, ModTime: obj.LastModified}); err != nil {
			return err
		}
	}
	return nil
}

// Delete is idempotent on S3 already: deleting a missing key succeeds.
func (s *s3Store) Delete(ctx context.Context, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	err := s.client.RemoveObject(ctx, s.bucket, s.key(name), minio.RemoveObjectOptions{})
	if err != nil && !isS3Code(err, "NoSuchKey") {
		return s3Err(ctx, "object "+name, err)
	}
	return nil
}
