package node

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/turnsnap/turnsnap/client"
)

// Client is the API client of the node whose Secret s is (SecretName):
// its endpoint, with its bearer token, verifying its TLS against the
// Secret's ca.crt alone (the node's self-signed certificate is pinned; the
// system's roots are not consulted). How the controller reaches a node.
func Client(s *corev1.Secret) (*client.Client, error) {
	endpoint := strings.TrimSpace(string(s.Data[SecretEndpoint]))
	token := strings.TrimSpace(string(s.Data[SecretToken]))
	if endpoint == "" || token == "" {
		return nil, fmt.Errorf("node Secret %s/%s: no %s or %s", s.Namespace, s.Name, SecretEndpoint, SecretToken)
	}
	opts := client.Options{URL: endpoint, Token: token}
	if strings.HasPrefix(endpoint, "https://") {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(s.Data[SecretCA]) {
			return nil, fmt.Errorf("node Secret %s/%s: %s holds no PEM certificate for %s", s.Namespace, s.Name, SecretCA, endpoint)
		}
		opts.HTTPClient = &http.Client{Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 64,
		}}
	}
	return client.New(opts)
}
