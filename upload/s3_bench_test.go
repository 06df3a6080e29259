package upload_test

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
)

// BenchmarkS3Put uploads the same bytes to MinIO on loopback through the S3
// store (with WithRetry, as the engine uses it) and through plain minio-go
// PutObject with its default options, alternating the two in every
// iteration so that load from anything else on the machine falls on both
// alike. It reports each one's MB/s and their ratio (store / plain); the
// standard MB/s column counts both uploads of an iteration.
//
// 16MiB is a pack: one PUT for both. 64MiB is multipart for both: the
// store sends 32 MiB parts one after another from a stream it checksums,
// plain minio-go sends 16 MiB parts four at a time from the ReaderAt.
func BenchmarkS3Put(b *testing.B) {
	sizes := []int{16 << 20, 64 << 20}
	if os.Getenv("TURNSNAP_BENCH_SMALL") == "1" {
		sizes = []int{1 << 20}
	}
	srv := miniotest.Start(b)
	cfg := s3Config(srv, srv.Endpoint)
	store := upload.WithRetry(newS3(b, cfg), upload.RetryPolicy{})
	plain, err := minio.New(srv.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range sizes {
		data := randomBytes(uint64(size), size)
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(2 * int64(size))
			var ours, theirs time.Duration
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("bench/%d", i%4)
				start := time.Now()
				if err := upload.PutBytes(b.Context(), store, name, data); err != nil {
					b.Fatal(err)
				}
				ours += time.Since(start)
				start = time.Now()
				_, err := plain.PutObject(b.Context(), testBucket, cfg.Prefix+"/plain/"+name, bytes.NewReader(data), int64(size), minio.PutObjectOptions{})
				if err != nil {
					b.Fatal(err)
				}
				theirs += time.Since(start)
			}
			mbps := func(d time.Duration) float64 { return float64(b.N) * float64(size) / 1e6 / d.Seconds() }
			b.ReportMetric(mbps(ours), "store-MB/s")
			b.ReportMetric(mbps(theirs), "minio-go-MB/s")
			b.ReportMetric(theirs.Seconds()/ours.Seconds(), "ratio")
		})
	}
}
