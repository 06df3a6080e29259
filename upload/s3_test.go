package upload_test

// Tests of the S3 store against a real MinIO server on 127.0.0.1, started
// by internal/miniotest (built by scripts/deps.d/40-minio.sh).

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	mrand "math/rand/v2"
	"testing"

	"github.com/turnsnap/turnsnap/internal/faultproxy"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

const testBucket = "turnsnap-test"

// s3Config is the configuration of a store on srv under a fresh random
// prefix, so every store made from it starts empty.
func s3Config(srv *miniotest.Server, endpoint string) upload.S3Config {
	return upload.S3Config{
		Endpoint:     endpoint,
		Bucket:       testBucket,
		Prefix:       "t/" + randomName(),
		Insecure:     true,
		AccessKey:    srv.AccessKey,
		SecretKey:    srv.SecretKey,
		Region:       "us-east-1",
		CreateBucket: true,
	}
}

func newS3(t testing.TB, cfg upload.S3Config) upload.Store {
	t.Helper()
	s, err := upload.NewS3(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func randomName() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func TestS3Conformance(t *testing.T) {
	srv := miniotest.Start(t)
	storetest.Run(t, func(t *testing.T) upload.Store { return newS3(t, s3Config(srv, srv.Endpoint)) })
}

func TestS3ThroughProxyPass(t *testing.T) {
	srv := miniotest.Start(t)
	p, err := faultproxy.Start("http://"+srv.Endpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	storetest.Run(t, func(t *testing.T) upload.Store { return newS3(t, s3Config(srv, p.Addr)) })
}

// randomBytes returns n bytes that depend only on seed.
func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	mrand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(b)
	return b
}

func readAll(t testing.TB, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantStored checks, by hash and by Stat, that s holds exactly data as name.
func wantStored(t testing.TB, s upload.Store, name string, data []byte) {
	t.Helper()
	rc, err := s.Get(t.Context(), name)
	if err != nil {
		t.Fatalf("Get %s: %v", name, err)
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		t.Fatalf("Get %s: read: %v", name, err)
	}
	if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) || n != int64(len(data)) {
		t.Fatalf("Get %s: %d bytes with another hash, want %d bytes", name, n, len(data))
	}
	info, err := s.Stat(t.Context(), name)
	if err != nil || info.Size != int64(len(data)) {
		t.Fatalf("Stat %s = %+v, %v; want size %d", name, info, err, len(data))
	}
}
