package upload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// S3Config says where an S3-compatible bucket is and how to reach it. The
// zero value of every optional field works.
type S3Config struct {
	// Endpoint is HOST:PORT of the service, without a scheme
	// ("127.0.0.1:9000", "s3.eu-west-1.amazonaws.com").
	Endpoint string
	// Bucket must exist unless CreateBucket is set.
	Bucket string
	// Prefix is prepended, with a slash, to every object name, so several
	// repositories (or tests) can share one bucket. Empty means the bucket
	// root. It must be a valid object name itself ("turnsnap/prod").
	Prefix string
	// Region is the bucket's region. Empty asks the service once
	// (GetBucketLocation) and caches the answer.
	Region string
	// Insecure turns TLS off: plain HTTP, for a server on loopback or a
	// trusted network. Payloads are then still signed chunk by chunk
	// (SHA-256), so a damaged body is refused by the server.
	Insecure bool
	// CAFile, if set, is a PEM bundle trusted in addition to the system's
	// roots, for a self-hosted server with its own CA.
	CAFile string
	// AccessKey and SecretKey, if both set, are used as given. Otherwise the
	// credentials come from the standard chain: AWS_ACCESS_KEY_ID /
	// AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the environment, then
	// the shared files ~/.aws/credentials and ~/.aws/config (AWS_PROFILE,
	// AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE are honoured), then
	// MINIO_ROOT_USER / MINIO_ROOT_PASSWORD.
	AccessKey    string
	SecretKey    string
	SessionToken string
	// CreateBucket makes NewS3 create the bucket if it does not exist, as
	// `turnsnap init --remote` wants. Otherwise a missing bucket is an error.
	CreateBucket bool
	// PartSize is the multipart threshold and part size; 0 means
	// DefaultPartSize. Objects up to PartSize go up as one PUT.
	PartSize int64
	// ResponseTimeout bounds the wait for a response's headers once a
	// request is sent; 0 means one minute. It is what turns a server that
	// accepted a connection and then hung into a retryable error.
	ResponseTimeout time.Duration
}

// DefaultPartSize is 32 MiB. The engine's packs are flushed at 16 MiB plus
// at most one 256 KiB chunk, so with minio-go's own default (16 MiB) almost
// every pack would become a two-part multipart upload, its second part a few
// KiB: three requests instead of one and an orphaned upload to clean up
// after a crash. At 32 MiB every pack is a single atomic PUT, and larger
// objects (process images, imports) still go up in parts that one failed
// request does not make us resend whole. minio-go buffers one part per
// upload stream, so the cost is 32 MiB of memory per concurrent large upload.
const DefaultPartSize = 32 << 20

// minPartSize is S3's smallest allowed part (except the last).
const minPartSize = 5 << 20

// s3Store keeps object NAME at key PREFIX/NAME of one bucket.
type s3Store struct {
	client   *minio.Client
	core     minio.Core
	bucket   string
	prefix   string // "" or ending in "/"
	partSize int64
}

// NewS3 returns a Store backed by an S3-compatible bucket. It checks the
// bucket exists (creating it if cfg.CreateBucket), so a wrong endpoint,
// bucket or key fails here rather than at the first checkpoint. The store
// also implements RangeGetter; its Get bodies implement Resumer.
//
// The client does not retry by itself (minio-go's own retries are turned
// off): wrap the store with WithRetry, so one policy, with one bound on
// attempts and time, governs every request.
func NewS3(ctx context.Context, cfg S3Config) (Store, error) {
	where := fmt.Sprintf("s3 bucket %s at %s", cfg.Bucket, cfg.Endpoint)
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, fmt.Errorf("%s: endpoint and bucket are required: %w", where, errdefs.ErrInvalid)
	}
	if err := s3utils.CheckValidBucketName(cfg.Bucket); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", where, errdefs.ErrInvalid, err)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		if err := CheckName(prefix); err != nil {
			return nil, fmt.Errorf("%s: prefix: %w", where, err)
		}
		prefix += "/"
	}
	partSize := cfg.PartSize
	if partSize == 0 {
		partSize = DefaultPartSize
	}
	if partSize < minPartSize {
		return nil, fmt.Errorf("%s: part size %d is below S3's minimum of 5 MiB: %w", where, partSize, errdefs.ErrInvalid)
	}
	transport, err := s3Transport(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     s3Credentials(cfg),
		Secure:    !cfg.Insecure,
		Transport: transport,
		Region:    cfg.Region,
		// Needed for the CRC32C trailer every PUT carries (see Put).
		TrailingHeaders: true,
		// One attempt per call: WithRetry is the retry policy.
		MaxRetries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", where, errdefs.ErrInvalid, err)
	}
	s := &s3Store{client: client, core: minio.Core{Client: client}, bucket: cfg.Bucket, prefix: prefix, partSize: partSize}
	// A few quick tries: a flaky first contact should not fail `init`, a
	// wrong endpoint should not hang it.
	probe := RetryPolicy{MaxAttempts: 4, Logger: slog.Default()}.withDefaults()
	if err := probe.do(ctx, OpStat, where, func() error { return s.ensureBucket(ctx, cfg) }); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return s, nil
}

func (s *s3Store) ensureBucket(ctx context.Context, cfg S3Config) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return s3Err(ctx, "checking the bucket", err)
	}
	if ok {
		return nil
	}
	if !cfg.CreateBucket {
		return fmt.Errorf("the bucket does not exist: %w", errdefs.ErrNotFound)
	}
	err = s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: cfg.Region})
	if err != nil {
		if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			return nil // created concurrently by another host or test
		}
		return s3Err(ctx, "creating the bucket", err)
	}
	return nil
}

func s3Credentials(cfg S3Config) *credentials.Credentials {
	if cfg.AccessKey != "" && cfg.SecretKey != "" {
		return credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)
	}
	return credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.EnvMinio{},
	})
}

func s3Transport(cfg S3Config) (*http.Transport, error) {
	t, err := minio.DefaultTransport(!cfg.Insecure)
	if err != nil {
		return nil, err
	}
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.ResponseHeaderTimeout = time.Minute
	if cfg.ResponseTimeout > 0 {
		t.ResponseHeaderTimeout = cfg.ResponseTimeout
	}
	if cfg.CAFile != "" && !cfg.Insecure {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate: %w", cfg.CAFile, errdefs.ErrInvalid)
		}
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		t.TLSClientConfig.RootCAs = pool
	}
	return t, nil
}

// ParseS3URL reads "s3://BUCKET/PREFIX" (the form `turnsnap init --remote`
// takes) into the Bucket and Prefix of an S3Config; the caller adds the
// endpoint and the rest.
func ParseS3URL(raw string) (S3Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return S3Config{}, fmt.Errorf("remote %q: want s3://BUCKET[/PREFIX]: %w", raw, errdefs.ErrInvalid)
	}
	cfg := S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	if cfg.Prefix != "" {
		if err := CheckName(cfg.Prefix); err != nil {
			return S3Config{}, fmt.Errorf("remote %q: prefix: %w", raw, err)
		}
	}
	return cfg, nil
}

func (s *s3Store) key(name string) string { return s.prefix + name }

func (s *s3Store) String() string { return "s3://" + s.bucket + "/" + s.prefix }
