package upload_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
)

func TestParseS3URL(t *testing.T) {
	for _, tc := range []struct {
		in             string
		bucket, prefix string
		ok             bool
	}{
		{"s3://bucket", "bucket", "", true},
		{"s3://bucket/", "bucket", "", true},
		{"s3://bucket/team/prod", "bucket", "team/prod", true},
		{"s3://bucket/team/prod/", "bucket", "team/prod", true},
		{"http://bucket/x", "", "", false},
		{"s3:///x", "", "", false},
		{"s3://bucket/a//b", "", "", false},
		{"s3://bucket/a?x=1", "", "", false},
	} {
		cfg, err := upload.ParseS3URL(tc.in)
		if tc.ok != (err == nil) || cfg.Bucket != tc.bucket || cfg.Prefix != tc.prefix {
			t.Errorf("ParseS3URL(%q) = %q, %q, %v", tc.in, cfg.Bucket, cfg.Prefix, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseS3URL(%q): error %v is not ErrInvalid", tc.in, err)
		}
	}
}

// TestS3Credentials: with no keys in the config, the store finds them in
// the AWS environment variables, or else in the shared credentials file.
func TestS3Credentials(t *testing.T) {
	srv := miniotest.Start(t)
	for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "AWS_CONFIG_FILE"} {
		t.Setenv(v, "")
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(home, "none"))
	cfg := s3Config(srv, srv.Endpoint)
	cfg.AccessKey, cfg.SecretKey = "", ""

	if _, err := upload.NewS3(t.Context(), cfg); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("NewS3 without credentials: %v, want ErrPrecondition (access denied)", err)
	}

	t.Run("environment", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
		if err := upload.PutBytes(t.Context(), newS3(t, cfg), "x", []byte("env")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("file", func(t *testing.T) {
		file := filepath.Join(home, ".aws", "credentials")
		os.MkdirAll(filepath.Dir(file), 0o700)
		creds := fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", srv.AccessKey, srv.SecretKey)
		if err := os.WriteFile(file, []byte(creds), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "")
		if err := upload.PutBytes(t.Context(), newS3(t, cfg), "x", []byte("file")); err != nil {
			t.Fatal(err)
		}
	})
}

func TestS3ConfigErrors(t *testing.T) {
	srv := miniotest.Start(t)
	good := s3Config(srv, srv.Endpoint)
	for _, tc := range []struct {
		name string
		edit func(*upload.S3Config)
		want error
	}{
		{"wrong secret", func(c *upload.S3Config) { c.SecretKey += "x" }, errdefs.ErrPrecondition},
		{"missing bucket", func(c *upload.S3Config) { c.Bucket, c.CreateBucket = "no-such-bucket", false }, errdefs.ErrNotFound},
		{"bad bucket name", func(c *upload.S3Config) { c.Bucket = "a" }, errdefs.ErrInvalid},
		{"bad prefix", func(c *upload.S3Config) { c.Prefix = "a/../b" }, errdefs.ErrInvalid},
		{"small parts", func(c *upload.S3Config) { c.PartSize = 1 << 20 }, errdefs.ErrInvalid},
		{"nothing listening", func(c *upload.S3Config) { c.Endpoint = "127.0.0.1:1" }, errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.edit(&cfg)
			start := time.Now()
			_, err := upload.NewS3(t.Context(), cfg)
			if !errors.Is(err, tc.want) {
				t.Errorf("NewS3: %v, want %v", err, tc.want)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("NewS3 took %s to fail", took)
			}
		})
	}
}
