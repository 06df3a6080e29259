package upload

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"

	"github.com/minio/minio-go/v7"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// s3Err turns an error minio-go returned while doing what ("object NAME",
// "list PREFIX") into the store's terms: one errdefs class, wrapped with the
// server's own code and message. WithRetry retries ErrUnavailable only.
func s3Err(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		// The request was aborted because the caller gave up; whatever the
		// transport made of that is noise.
		return fmt.Errorf("%s: %w (%v)", what, ctxErr, err)
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && (resp.Code != "" || resp.StatusCode != 0) {
		return fmt.Errorf("%s: %w: %s: %s (HTTP %d)", what, s3Class(resp), resp.Code, resp.Message, resp.StatusCode)
	}
	if tlsTrustError(err) {
		return fmt.Errorf("%s: %w: %w", what, errdefs.ErrPrecondition, err)
	}
	// No answer from the server: refused, reset or timed out connections,
	// truncated bodies. All may succeed on a later try.
	return fmt.Errorf("%s: %w: %w", what, errdefs.ErrUnavailable, err)
}

// s3Class picks the errdefs class of an S3 error response.
func s3Class(resp minio.ErrorResponse) error {
	switch resp.Code {
	case "NoSuchKey", "NoSuchVersion":
		return errdefs.ErrNotFound
	case "NoSuchBucket":
		// Not ErrNotFound: callers would read it as "this object is
		// missing" when the whole remote is misconfigured or gone.
		return fmt.Errorf("bucket %s does not exist: %w", resp.BucketName, errdefs.ErrPrecondition)
	case "RequestTimeout", "SlowDown", "SlowDownWrite", "SlowDownRead", "Throttling",
		"ThrottlingException", "RequestLimitExceeded", "RequestThrottled",
		"InternalError", "ServiceUnavailable", "XMinioServerNotInitialized",
		"XMinioReadQuorum", "XMinioWriteQuorum", "ExpiredToken", "ExpiredTokenException":
		return errdefs.ErrUnavailable
	case "BadDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch", "IncompleteBody":
		// The server received bytes other than the ones sent and refused
		// to store them: damage in transit. A retry re-reads the source,
		// so it is transient although the status is 400.
		return errdefs.ErrUnavailable
	case "PreconditionFailed", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
		"RequestTimeTooSkewed", "AuthorizationHeaderMalformed", "PermanentRedirect":
		return errdefs.ErrPrecondition
	}
	switch s := resp.StatusCode; {
	case s == http.StatusNotFound:
		return errdefs.ErrNotFound
	case s >= 500, s == http.StatusTooManyRequests, s == http.StatusRequestTimeout:
		return errdefs.ErrUnavailable
	case s == http.StatusForbidden, s == http.StatusPreconditionFailed, s >= 300 && s < 400:
		return errdefs.ErrPrecondition
	}
	// Other 4xx, and minio-go's own argument checks (status 0).
	return errdefs.ErrInvalid
}

// tlsTrustError reports whether err says the server's certificate is not
// trusted, which no retry will change.
func tlsTrustError(err error) bool {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// isS3Code reports whether err carries the S3 error code code.
func isS3Code(err error, code string) bool {
	var resp minio.ErrorResponse
	return errors.As(err, &resp) && resp.Code == code
}
