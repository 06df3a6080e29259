package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// holding reports whether some file under dir contains marker.
func holding(t *testing.T, dir string, marker []byte) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || found || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		found = err == nil && bytes.Contains(b, marker)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// init --encrypt-local=false as a user types it: the home's config says
// so (and keyed IDs), a marker file is in the local store and in no byte
// of the bucket, a second home restores with the key and fails with the
// key error's exit code without it.
func TestCLIEncryptLocalFalse(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	h1, h2, h3 := filepath.Join(dir, "h1"), filepath.Join(dir, "h2"), filepath.Join(dir, "h3")
	key := filepath.Join(dir, "master.key")
	base := filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() {
		run(t, h1, "sandbox", "rm", "s")
		run(t, h2, "sandbox", "rm", "copy")
		run(t, h2, "sandbox", "rm", "s")
	})
	if out, code := run(t, h1, "key", "generate", key); code != 0 {
		t.Fatalf("key generate: exit %d: %s", code, out)
	}
	remote := []string{"init", "--remote", "s3://halfsealed/team", "--endpoint", srv.Endpoint, "--insecure"}
	if out, code := run(t, h1, append(remote, "--encrypt-local=false")...); code != exitUsage {
		t.Fatalf("--encrypt-local=false without a key: exit %d, want %d: %s", code, exitUsage, out)
	}
	var ini struct {
		KeyID        string `json:"key_id"`
		IDs          string `json:"ids"`
		EncryptLocal bool   `json:"encrypt_local"`
	}
	runJSON(t, h1, &ini, append(remote, "--key-file", key, "--encrypt-local=false")...)
	if ini.KeyID == "" || ini.IDs != "blake3-keyed" || ini.EncryptLocal {
		t.Fatalf("init --json: %+v", ini)
	}
	var cfg struct {
		Encryption struct {
			IDs        string `json:"ids"`
			PlainLocal bool   `json:"plain_local"`
		} `json:"encryption"`
	}
	b, err := os.ReadFile(filepath.Join(h1, "config.json"))
	if err != nil || json.Unmarshal(b, &cfg) != nil || cfg.Encryption.IDs != "blake3-keyed" || !cfg.Encryption.PlainLocal {
		t.Fatalf("config.json after init --encrypt-local=false: %s (%v)", b, err)
	}

	var created struct{ Root string }
	runJSON(t, h1, &created, "sandbox", "create", "s", "--base", base)
	mark := make([]byte, 96<<10) // incompressible, so stored as is
	rand.Read(mark)
	copy(mark[1000:], "TSMARK-CLI-plain-local-5e2b")
	os.WriteFile(filepath.Join(created.Root, "secret.bin"), mark, 0o644)
	var ck struct {
		ID     string
		Remote bool `json:"remote_durable"`
	}
	runJSON(t, h1, &ck, "checkpoint", "s", "--wait-remote")
	if !ck.Remote {
		t.Fatalf("checkpoint --wait-remote: %+v", ck)
	}
	if !holding(t, filepath.Join(h1, "store"), []byte("TSMARK-CLI-plain-local-5e2b")) {
		t.Fatal("the plaintext local store does not show the marker")
	}
	if holding(t, srv.Dir, []byte("TSMARK-CLI-plain-local-5e2b")) {
		t.Fatal("the marker is in plaintext in the bucket")
	}

	runJSON(t, h2, &ini, append(remote, "--key-file", key)...)
	if ini.IDs != "blake3-keyed" || !ini.EncryptLocal {
		t.Fatalf("init --json on the second home: %+v", ini)
	}
	var rb struct{ Checkpoints int }
	runJSON(t, h2, &rb, "catalog", "rebuild")
	var br struct{ Root string }
	runJSON(t, h2, &br, "branch", ck.ID, "copy")
	if got, err := os.ReadFile(filepath.Join(br.Root, "secret.bin")); err != nil || !bytes.Equal(got, mark) {
		t.Fatalf("restored file: %d bytes, %v", len(got), err)
	}
	if out, code := run(t, h2, "verify", ck.ID); code != 0 {
		t.Fatalf("verify on the second home: exit %d: %s", code, out)
	}
	if out, code := run(t, h3, remote...); code != exitKey {
		t.Fatalf("init of the sealed bucket without the key: exit %d, want %d: %s", code, exitKey, out)
	}
}
