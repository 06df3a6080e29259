package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// EnsureCredentials makes the node's per-node credentials where they are
// missing, so that a DaemonSet needs no Secret per node: tokenFile gets a
// random bearer token, and certFile/keyFile (when both are named) a
// self-signed certificate for hosts. Files that exist are kept, so a
// restarted agent keeps its token and certificate; the agent publishes
// both in its Secret, where the controller reads them. Each file is
// written beside its final name and renamed, so a crash never leaves a
// half-written one that a later start would accept.
func EnsureCredentials(tokenFile, certFile, keyFile string, hosts []string) error {
	if tokenFile != "" {
		if err := ensureFile(tokenFile, func() ([]byte, error) {
			b := make([]byte, 32)
			if _, err := rand.Read(b); err != nil {
				return nil, err
			}
			return []byte(hex.EncodeToString(b) + "\n"), nil
		}); err != nil {
			return fmt.Errorf("node token %s: %w", tokenFile, err)
		}
	}
	if certFile == "" || keyFile == "" {
		return nil
	}
	_, cerr := os.Stat(certFile)
	_, kerr := os.Stat(keyFile)
	switch {
	case cerr == nil && kerr == nil:
		return nil
	case cerr == nil || kerr == nil:
		return fmt.Errorf("node TLS: only one of %s and %s exists: remove it or supply both", certFile, keyFile)
	case !errors.Is(cerr, os.ErrNotExist) || !errors.Is(kerr, os.ErrNotExist):
		return fmt.Errorf("node TLS: %v / %v", cerr, kerr)
	}
	certPEM, keyPEM, err := selfSigned(hosts)
	if err != nil {
		return fmt.Errorf("node TLS: %w", err)
	}
	// The key first: a crash between the two leaves a key alone, which the
	// check above reports rather than pairing it with another certificate.
	if err := ensureFile(keyFile, func() ([]byte, error) { return keyPEM, nil }); err != nil {
		return fmt.Errorf("node TLS key %s: %w", keyFile, err)
	}
	if err := ensureFile(certFile, func() ([]byte, error) { return certPEM, nil }); err != nil {
		return fmt.Errorf("node TLS certificate %s: %w", certFile, err)
	}
	return nil
}

// ensureFile writes gen()'s bytes to path (mode 0600) unless it exists.
func ensureFile(path string, gen func() ([]byte, error)) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	b, err := gen()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// selfSigned makes an ECDSA P-256 certificate for hosts (IP addresses or
// DNS names), valid for ten years: it is pinned, not chained (the
// controller trusts exactly the certificate in the node's Secret).
func selfSigned(hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "turnsnap node agent"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // its own issuer, so that it verifies as a root
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
