package node

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

// Missing credentials are made once and kept: the token (random, 0600),
// and a self-signed certificate for the listen address that verifies as
// its own root; a key without its certificate is refused, not paired.
func TestEnsureCredentials(t *testing.T) {
	dir := t.TempDir()
	tok, crt, key := filepath.Join(dir, "node", "token"), filepath.Join(dir, "node", "tls.crt"), filepath.Join(dir, "node", "tls.key")
	if err := EnsureCredentials(tok, crt, key, []string{"10.213.7.11", "node1"}); err != nil {
		t.Fatal(err)
	}
	t1, err := os.ReadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(bytes.TrimSpace(t1)); n != 64 {
		t.Fatalf("token of %d characters, want 64 hex", n)
	}
	for _, p := range []string{tok, key} {
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := os.ReadFile(crt)
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	for _, host := range []string{"10.213.7.11", "node1"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
			t.Errorf("the certificate does not verify %s against itself: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.213.7.12"}); err == nil {
		t.Error("the certificate verifies another address")
	}

	// A second start keeps all three.
	if err := EnsureCredentials(tok, crt, key, []string{"10.213.7.11", "node1"}); err != nil {
		t.Fatal(err)
	}
	t2, _ := os.ReadFile(tok)
	c2, _ := os.ReadFile(crt)
	if !bytes.Equal(t1, t2) || !bytes.Equal(c1, c2) {
		t.Fatal("a second EnsureCredentials replaced the token or the certificate")
	}

	// A key alone (a crash between the two writes) is refused.
	if err := os.Remove(crt); err != nil {
		t.Fatal(err)
	}
	if err := EnsureCredentials(tok, crt, key, nil); err == nil {
		t.Fatal("a key without its certificate was accepted")
	}
}
