package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"
	"github.com/turnsnap/turnsnap/kube/node"
	"github.com/turnsnap/turnsnap/server"
)

// registerKubeNodeFlags adds serve's --kube-* flags (docs/KUBERNETES.md).
func registerKubeNodeFlags(fl *pflag.FlagSet, o *node.DaemonOptions) {
	fl.StringVar(&o.Node, "kube-node", "", "register this daemon as the turnsnap node NAME with the Kubernetes API (a Lease it renews, a Secret with its endpoint and token); needs --listen")
	fl.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file for --kube-node (default: the pod's in-cluster config)")
	fl.StringVar(&o.Namespace, "kube-namespace", "", "namespace of the node's Lease and Secret (default: the pod's, else "+node.DefaultNamespace+")")
	fl.StringVar(&o.Endpoint, "kube-endpoint", "", "the URL the controller calls this node at (default: from --listen)")
	fl.DurationVar(&o.LeaseDuration, "kube-lease-duration", node.DefaultLeaseDuration, "the node's Lease duration: renewed every third of it; the node is dead to the controller once a renewal is this late")
}

// withKubeNode prepares the node agent of --kube-node: it makes the
// per-node token and, for a non-loopback --listen, a self-signed
// certificate where their files (--token-file, --tls-cert, --tls-key) do
// not exist yet, and hooks the agent to the daemon's start. The returned
// function releases the node's Lease after the daemon has stopped.
func (a *app) withKubeNode(cfg *server.Config, o node.DaemonOptions) (stop func(), err error) {
	if cfg.Listen != "" {
		host, _, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w", cfg.Listen, err)
		}
		hosts := []string{host, o.Node}
		if err := node.EnsureCredentials(cfg.TokenFile, cfg.TLSCert, cfg.TLSKey, hosts); err != nil {
			return nil, err
		}
	}
	var token []byte
	if cfg.Listen != "" {
		// The token serve demands, read as serve reads it.
		if token, err = server.ReadToken(cfg.TokenFile); err != nil {
			return nil, err
		}
	}
	d, err := node.NewDaemon(o, cfg.Listen, token, cfg.TLSCert)
	if err != nil {
		return nil, err
	}
	cfg.Serving = func(ctx context.Context, s server.Serving) {
		d.Serving(ctx, s.HomeID, s.TCPAddr, s.Log)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			a.log.Warn("kube node: the Lease was not released; it expires after its duration", "err", err)
		}
	}, nil
}
