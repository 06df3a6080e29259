package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultNamespace is the namespace of a node agent outside a pod when
// none is given; deploy/kubernetes/namespace.yaml makes it.
const DefaultNamespace = "turnsnap-system"

// inClusterNamespace is where a pod finds its own namespace.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// DaemonOptions are `turnsnap serve`'s --kube-* flags.
type DaemonOptions struct {
	Node       string // --kube-node: the node name to register as
	Kubeconfig string // --kubeconfig: "" is the pod's in-cluster config
	Namespace  string // --kube-namespace: "" is the pod's namespace, else DefaultNamespace
	// Endpoint is the URL the controller calls (--kube-endpoint); "" is
	// derived from the TCP listener, which must then name an address.
	Endpoint      string
	LeaseDuration time.Duration // --kube-lease-duration
}

// Daemon runs a node agent beside `turnsnap serve`: Serving (the daemon's
// Config.Serving) registers and renews in the background, Stop ends that
// and releases the Lease.
type Daemon struct {
	o         DaemonOptions
	client    kubernetes.Interface
	token, ca []byte
	tls       bool

	mu    sync.Mutex
	agent *Agent // set once registered
	stop  context.CancelFunc
	done  chan struct{}
}

// NewDaemon checks the options against serve's listener flags and makes
// the Kubernetes client. listen is --listen, token the one serve read from
// --token-file (server.ReadToken), tlsCert --tls-cert ("" for plain HTTP
// on loopback).
func NewDaemon(o DaemonOptions, listen string, token []byte, tlsCert string) (*Daemon, error) {
	if listen == "" {
		return nil, errors.New("--kube-node needs --listen (and --token-file): the controller reaches the node over TCP")
	}
	if o.Endpoint == "" {
		host, _, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w", listen, err)
		}
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			return nil, fmt.Errorf("--listen %s serves every address: give the one the controller calls with --kube-endpoint", listen)
		}
	}
	d := &Daemon{o: o, tls: tlsCert != "", token: token}
	var err error
	if tlsCert != "" {
		if d.ca, err = os.ReadFile(tlsCert); err != nil {
			return nil, fmt.Errorf("--kube-node: the TLS certificate: %w", err)
		}
	}
	if d.o.Namespace == "" {
		d.o.Namespace = DefaultNamespace
		if b, err := os.ReadFile(inClusterNamespace); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			d.o.Namespace = strings.TrimSpace(string(b))
		}
	}
	// An empty kubeconfig path means the in-cluster config (the pod's
	// ServiceAccount token), as client-go's own fallback.
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kube-node: Kubernetes client config: %w", err)
	}
	cfg.UserAgent = "turnsnap-node-agent"
	if d.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("--kube-node: Kubernetes client: %w", err)
	}
	// Check the rest now, so that a bad flag fails serve at once rather
	// than in the background once the home is open.
	if _, err := New(Config{Client: d.client, Namespace: d.o.Namespace, Node: o.Node, HomeID: "check",
		Endpoint: "check", Token: d.token, LeaseDuration: o.LeaseDuration}); err != nil {
		return nil, err
	}
	return d, nil
}

// Serving starts the agent for the daemon that now serves (the daemon's
// Config.Serving hook): it registers, retrying while the API server does
// not answer, then renews until ctx ends or Stop. It returns at once.
func (d *Daemon) Serving(ctx context.Context, homeID, tcpAddr string, log *slog.Logger) {
	endpoint := d.o.Endpoint
	if endpoint == "" {
		scheme := "http"
		if d.tls {
			scheme = "https"
		}
		endpoint = scheme + "://" + tcpAddr
	}
	a, err := New(Config{Client: d.client, Namespace: d.o.Namespace, Node: d.o.Node, HomeID: homeID,
		Endpoint: endpoint, Token: d.token, CA: d.ca, LeaseDuration: d.o.LeaseDuration, Log: log})
	if err != nil { // NewDaemon checked the same options
		log.Error("kube node agent not started", "err", err)
		return
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	d.mu.Lock()
	d.stop, d.done = cancel, done
	d.mu.Unlock()
	go func() {
		defer close(done)
		for {
			err := a.Register(actx)
			if err == nil {
				break
			}
			if actx.Err() != nil {
				return
			}
			log.Error("kube node registration failed; retrying", "err", err)
			if sleep(actx, a.renewEvery()) != nil {
				return
			}
		}
		d.mu.Lock()
		d.agent = a
		d.mu.Unlock()
		if err := a.Run(actx); err != nil {
			log.Error("kube node agent stopped", "err", err)
		}
	}()
}

// Stop ends the agent and releases the Lease if it was registered (a
// clean shutdown: the controller sees the node leave at once).
func (d *Daemon) Stop(ctx context.Context) error {
	d.mu.Lock()
	stop, done := d.stop, d.done
	d.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	<-done
	d.mu.Lock()
	a := d.agent
	d.mu.Unlock()
	if a == nil {
		return nil
	}
	return a.Release(ctx)
}
