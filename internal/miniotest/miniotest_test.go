package miniotest

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

func client(t *testing.T, s *Server, retries int) *minio.Client {
	t.Helper()
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), MaxRetries: retries})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func get(ctx context.Context, c *minio.Client, bucket, key string) ([]byte, error) {
	o, err := c.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	defer o.Close()
	return io.ReadAll(o)
}

// A real server: it stores what is PUT, dies on Kill, and after Restart
// serves the same data on the same endpoint with the same credentials.
func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if !s.Running() {
		t.Fatal("a started server is not Running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client(t, s, 1)
	if err := c.MakeBucket(ctx, "bkt", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("turnsnap "), 1000)
	if _, err := c.PutObject(ctx, "bkt", "k", bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := get(ctx, c, "bkt", "k"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("GET after PUT: %d bytes, %v", len(got), err)
	}

	// Another client's credentials are refused: the server is this test's.
	other, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4("nobody", "wrong-secret-key", ""), MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ListBuckets(ctx); err == nil {
		t.Fatal("the server accepted credentials that are not its own")
	}

	s.Kill()
	if s.Running() {
		t.Fatal("a killed server is Running")
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err = get(short, client(t, s, 1), "bkt", "k")
	cancelShort()
	if err == nil {
		t.Fatal("a killed server answered a GET")
	}
	s.Kill() // killing a stopped server does nothing

	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if !s.Running() {
		t.Fatal("a restarted server is not Running")
	}
	if got, err := get(ctx, client(t, s, 1), "bkt", "k"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("GET after Restart: %d bytes, %v; the data directory did not survive", len(got), err)
	}
}

// Binary finds the deps script's build under TURNSNAP_CACHE.
func TestBinary(t *testing.T) {
	t.Setenv("TURNSNAP_CACHE", t.TempDir())
	bin, ok := Binary()
	if ok || filepath.Dir(filepath.Dir(bin)) != os.Getenv("TURNSNAP_CACHE") {
		t.Fatalf("Binary() = %q, %v in an empty cache", bin, ok)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := Binary(); ok {
		t.Fatal("Binary accepted a file that is not executable")
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok := Binary(); !ok {
		t.Fatal("Binary missed an executable server")
	}
}
