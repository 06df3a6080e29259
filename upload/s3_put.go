package upload

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Put uploads r as one PUT when size is at most the part size, and as a
// multipart upload in part-size pieces above it. Either way S3 makes the
// object visible only when the upload completes, so no reader ever sees a
// partial object.
//
// Integrity, end to end:
//   - Every request carries a CRC32C of its body (a trailer on single PUTs,
//     a header per part, and the whole object's CRC32C, merged from the
//     parts, on completion); the server recomputes it and refuses to store
//     the object on a mismatch.
//   - Put computes its own CRC32C of the bytes it read from r and compares
//     it with the one the server reports for the stored object; a mismatch
//     is ErrCorrupt. A server that reports no checksum gets a HEAD instead,
//     which must show the object at its full size.
//   - Over plain HTTP the body is also signed chunk by chunk (SHA-256), as
//     minio-go does by default without TLS.
//
// Put returns nil only after the server acknowledged the completed upload
// and the checks above passed. A reader that ends early or has bytes beyond
// size fails with ErrInvalid before the upload completes.
func (s *s3Store) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("object %s: negative size %d: %w", name, size, errdefs.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	body := &exactReader{r: r, size: size, left: size, crc: crc32.New(castagnoli)}
	if size == 0 {
		// minio-go never reads the body of an empty object, so look for
		// stray bytes here.
		if err := body.probe(); err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
	}
	info, err := s.client.PutObject(ctx, s.bucket, s.key(name), body, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		PartSize:    uint64(s.partSize),
		Checksum:    minio.ChecksumFullObjectCRC32C,
	})
	body.detach()
	if body.err != nil {
		// The source failed or disagreed with size: that, not what the
		// transport made of the aborted request, is the cause.
		return fmt.Errorf("object %s: %w", name, body.err)
	}
	if err != nil {
		return s3Err(ctx, "object "+name, err)
	}
	if body.left != 0 {
		return fmt.Errorf("object %s: the client sent %d of %d bytes and reported success: %w",
			name, size-body.left, size, errdefs.ErrCorrupt)
	}
	return s.verifyPut(ctx, name, size, info, body.crc)
}

// verifyPut checks that what the server stored is what Put read.
func (s *s3Store) verifyPut(ctx context.Context, name string, size int64, info minio.UploadInfo, crc hash.Hash32) error {
	want := base64.StdEncoding.EncodeToString(crc.Sum(nil))
	if info.ChecksumCRC32C != "" {
		if info.ChecksumCRC32C != want {
			return fmt.Errorf("object %s: the server stored CRC32C %s, the bytes sent have %s: %w",
				name, info.ChecksumCRC32C, want, errdefs.ErrCorrupt)
		}
		return nil
	}
	got, err := s.client.StatObject(ctx, s.bucket, s.key(name), minio.StatObjectOptions{})
	if err != nil {
		err = s3Err(ctx, "object "+name, err)
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("object %s: the server acknowledged the PUT but does not have the object: %w",
				name, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("checking the upload: %w", err)
	}
	if got.Size != size {
		return fmt.Errorf("object %s: the server stored %d bytes of %d: %w", name, got.Size, size, errdefs.ErrCorrupt)
	}
	return nil
}

// exactReader gives the upload exactly size bytes of r, computing their
// CRC32C, and fails if r has fewer or more. When r has more, the error
// comes instead of the last bytes, so the server never receives a whole
// body and cannot complete the object. Errors are sticky, and Put reports
// them in preference to the transport's.
//
// net/http may go on reading a request body in its own goroutine after the
// request has failed; detach cuts r off before Put returns, so the caller
// (WithRetry rewinding r for the next attempt) owns r alone again.
type exactReader struct {
	mu       sync.Mutex
	detached bool
	r        io.Reader
	size     int64
	left     int64
	crc      hash.Hash32
	err      error
}

// errDetached is what a late reader of a finished Put's body gets.
var errDetached = errors.New("the upload is over")

// detach waits for a Read in progress and makes every later one fail.
func (e *exactReader) detach() {
	e.mu.Lock()
	e.detached = true
	e.mu.Unlock()
}

func (e *exactReader) Read(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.detached {
		return 0, errDetached
	}
	if e.err != nil {
		return 0, e.err
	}
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if e.left == 0 {
		if perr := e.probe(); perr != nil {
			return 0, perr
		}
		e.crc.Write(p[:n])
		return n, nil
	}
	e.crc.Write(p[:n])
	switch {
	case errors.Is(err, io.EOF):
		e.err = fmt.Errorf("reader ended after %d of %d bytes: %w", e.size-e.left, e.size, errdefs.ErrInvalid)
		return 0, e.err
	case err != nil:
		e.err = fmt.Errorf("reading the source: %w", err)
		return n, e.err
	}
	return n, nil
}

// probe fails unless r is at its end.
func (e *exactReader) probe() error {
	var extra [1]byte
	n, err := io.ReadFull(e.r, extra[:])
	switch {
	case n > 0:
		e.err = fmt.Errorf("reader has more than the declared %d bytes: %w", e.size, errdefs.ErrInvalid)
	case err != nil && !errors.Is(err, io.EOF):
		e.err = fmt.Errorf("reading the source: %w", err)
	}
	return e.err
}

// GetVersion reads a small object whole, with its ETag. The body is read
// first, in one GET, and the ETag taken from that GET's answer: a Stat
// first would make minio-go pin the read to the stat's ETag, and an
// object replaced in between (a head another home just wrote) would fail
// the read with 412 instead of giving the newer version.
func (s *s3Store) GetVersion(ctx context.Context, name string, max int64) ([]byte, string, error) {
	if err := CheckName(name); err != nil {
		return nil, "", err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, s.key(name), minio.GetObjectOptions{})
	if err != nil {
		return nil, "", s3Err(ctx, "object "+name, err)
	}
	defer obj.Close()
	data, err := io.ReadAll(io.LimitReader(obj, max+1))
	if err != nil {
		var resp minio.ErrorResponse
		if errors.As(err, &resp) && resp.StatusCode == http.StatusPreconditionFailed {
			return nil, "", fmt.Errorf("object %s changed while it was read: %w", name, errdefs.ErrUnavailable)
		}
		return nil, "", s3Err(ctx, "object "+name, err)
	}
	if int64(len(data)) > max {
		return nil, "", fmt.Errorf("object %s: larger than %d bytes: %w", name, max, errdefs.ErrCorrupt)
	}
	info, err := obj.Stat() // the GET's own answer, no new request
	if err != nil {
		return nil, "", s3Err(ctx, "object "+name, err)
	}
	if info.ETag == "" {
		return nil, "", fmt.Errorf("object %s: the server gave no ETag, which conditional writes need: %w", name, errdefs.ErrPrecondition)
	}
	return data, trimETag(info.ETag), nil
}

// PutIf is a single PUT with If-Match (match set) or If-None-Match: *
// (match empty); S3 answers 412 when the condition does not hold.
func (s *s3Store) PutIf(ctx context.Context, name string, data []byte, match string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	if int64(len(data)) > s.partSize {
		return "", fmt.Errorf("object %s: %d bytes is beyond a single conditional PUT: %w", name, len(data), errdefs.ErrInvalid)
	}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", Checksum: minio.ChecksumFullObjectCRC32C}
	if match == "" {
		opts.SetMatchETagExcept("*")
	} else {
		opts.SetMatchETag(match)
	}
	crc := crc32.New(castagnoli)
	crc.Write(data)
	info, err := s.client.PutObject(ctx, s.bucket, s.key(name), bytes.NewReader(data), int64(len(data)), opts)
	if err != nil {
		var resp minio.ErrorResponse
		if errors.As(err, &resp) && (resp.StatusCode == http.StatusPreconditionFailed || resp.Code == "PreconditionFailed" ||
			resp.StatusCode == http.StatusConflict && resp.Code == "ConditionalRequestConflict") {
			return "", fmt.Errorf("object %s: %w", name, ErrConditionFailed)
		}
		return "", s3Err(ctx, "object "+name, err)
	}
	if err := s.verifyPut(ctx, name, int64(len(data)), info, crc); err != nil {
		return "", err
	}
	return trimETag(info.ETag), nil
}

func trimETag(e string) string { return strings.Trim(e, `"`) }
