// Package kubetest runs a real Kubernetes API server (kube-apiserver and
// etcd, no kubelet, scheduler or controller-manager) for tests, through
// controller-runtime's envtest. The binaries are built by
// scripts/deps.d/80-kube.sh into $TURNSNAP_CACHE/kube/<Version>/, which is
// envtest's KUBEBUILDER_ASSETS; when they are absent, Start reports the part
// missing through testenv (a failure under `make test`).
//
// Without a kubelet nothing runs a pod and without a controller-manager
// owner references are never garbage collected: a test that needs either
// plays that part itself and says so.
package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Version is the Kubernetes release the API server is built from; the deps
// script builds the same one (TestDepsScriptVersion checks they agree).
const Version = "v1.37.2"

// EtcdVersion is the etcd release that goes with it.
const EtcdVersion = "v3.7.3"

// defaultCache is where scripts/deps.sh puts tools when TURNSNAP_CACHE is unset.
const defaultCache = "/var/cache/turnsnap"

// DefaultStartTimeout bounds the control plane's start (etcd, then the API
// server answering /healthz). It starts in 4-7 s on an idle machine here; the
// bound allows for a machine busy with builds, and a start that takes longer
// is a failure, never a hang.
const DefaultStartTimeout = 90 * time.Second

// AssetsDir is the directory holding kube-apiserver and etcd:
// KUBEBUILDER_ASSETS when set, else the deps script's cache directory.
func AssetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = defaultCache
	}
	return filepath.Join(cache, "kube", Version)
}

// Binaries returns AssetsDir and whether both binaries are there and
// executable.
func Binaries() (string, bool) {
	dir := AssetsDir()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		info, err := os.Stat(filepath.Join(dir, b))
		if err != nil || !info.Mode().IsRegular() || info.Mode()&0o111 == 0 {
			return dir, false
		}
	}
	return dir, true
}

// Options configure Start.
type Options struct {
	// Address is the address of this host the API server binds and is
	// reached at; "" is 127.0.0.1. A fleet test gives it the root
	// namespace's end of its bridge so that node agents in other network
	// namespaces reach it (the serving certificate names it).
	Address string
	// CRDDirs are directories of CRD manifests (YAML) to install before
	// Start returns; each must exist.
	CRDDirs []string
	// Scheme is the clients' scheme; nil is client-go's with the
	// apiextensions types added.
	Scheme *runtime.Scheme
	// StartTimeout bounds the control plane's start (DefaultStartTimeout).
	StartTimeout time.Duration
}

// Env is a running API server and admin clients of it.
type Env struct {
	// Config is an admin's (system:masters) connection.
	Config *rest.Config
	// Client is a controller-runtime client with Config and the scheme.
	Client client.Client
	// Clientset is client-go's typed client with Config.
	Clientset kubernetes.Interface
	// Host is the API server's URL (https://ADDR:PORT/).
	Host string
	// CRDs are the CRDs installed from Options.CRDDirs.
	CRDs []*apiextensionsv1.CustomResourceDefinition

	env *envtest.Environment
}

// Start starts etcd and kube-apiserver for t and stops them when t ends
// (also when Start fails half way). It fails t if they do not come up
// within Options.StartTimeout.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	dir, ok := Binaries()
	if !ok {
		testenv.Missing(t, "kube-apiserver and etcd "+Version,
			dir+" lacks them; scripts/deps.d/80-kube.sh builds them (`make deps`)")
	}
	if o.Address == "" {
		o.Address = "127.0.0.1"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Scheme == nil {
		o.Scheme = runtime.NewScheme()
		if err := clientgoscheme.AddToScheme(o.Scheme); err != nil {
			t.Fatal(err)
		}
		if err := apiextensionsv1.AddToScheme(o.Scheme); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range o.CRDDirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("kubetest: CRD directory: %v", err)
		}
	}
	port, err := testenv.FreePort(o.Address)
	if err != nil {
		t.Fatalf("kubetest: a free port on %s: %v", o.Address, err)
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		CRDDirectoryPaths:        o.CRDDirs,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   o.Scheme,
		ControlPlaneStartTimeout: o.StartTimeout,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	api := te.ControlPlane.GetAPIServer()
	api.SecureServing.Address = o.Address
	api.SecureServing.Port = strconv.Itoa(port)
	// envtest starts the API server with --advertise-address=127.0.0.1,
	// which it refuses with the default endpoint reconciler; no test needs
	// the kubernetes Service's endpoints.
	api.Configure().Set("endpoint-reconciler-type", "none")
	logs := &tailBuffer{max: 64 << 10}
	api.Out, api.Err = logs, logs
	te.ControlPlane.Etcd = &envtest.Etcd{Out: logs, Err: logs}

	e := &Env{env: te}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), o.StartTimeout+10*time.Second)
	defer cancel()
	cfg, startDone, err := startBounded(ctx, te)
	// Registered before the outcome is looked at: a start that failed half
	// way (etcd up, the API server not) still stops what it started and
	// removes its files. Stop must not race a Start still going (one that
	// outran the bound), so it waits for it, boundedly: envtest's own
	// per-process timeouts end it.
	t.Cleanup(func() {
		select {
		case <-startDone:
		case <-time.After(2 * o.StartTimeout):
			t.Errorf("kubetest: the control plane's start has not returned after %v; stopping it anyway", 2*o.StartTimeout)
		}
		if err := te.Stop(); err != nil {
			t.Logf("kubetest: stopping the control plane: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("kubetest: starting kube-apiserver %s and etcd from %s: %v\ntheir output (end):\n%s", Version, dir, err, logs.String())
	}
	t.Logf("kubetest: kube-apiserver %s on %s up in %v", Version, cfg.Host, time.Since(began).Round(time.Millisecond))
	e.Config, e.Host, e.CRDs = cfg, cfg.Host, te.CRDs
	if e.Client, err = client.New(cfg, client.Options{Scheme: o.Scheme}); err != nil {
		t.Fatal(err)
	}
	if e.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

// startBounded runs te.Start, giving up when ctx ends (envtest's own
// timeouts cover each process's start, not the CRD installation or its
// retries). done is closed when te.Start has returned.
func startBounded(ctx context.Context, te *envtest.Environment) (*rest.Config, chan struct{}, error) {
	done := make(chan struct{})
	var cfg *rest.Config
	var err error
	go func() {
		defer close(done)
		cfg, err = te.Start()
	}()
	select {
	case <-done:
		return cfg, done, err
	case <-ctx.Done():
		return nil, done, fmt.Errorf("not up: %w", ctx.Err())
	}
}

// User is a user the API server authenticates (by a client certificate):
// its rest.Config, and a kubeconfig file for a process.
type User struct {
	Name       string
	Config     *rest.Config
	Kubeconfig string // path of a kubeconfig file for this user
}

// AddUser provisions a user with groups and writes its kubeconfig into a
// directory of t's. The API server authorizes with RBAC: the user may do
// only what roles bound to it (or its groups) allow.
func (e *Env) AddUser(t testing.TB, name string, groups ...string) *User {
	t.Helper()
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, &rest.Config{QPS: 100, Burst: 200})
	if err != nil {
		t.Fatalf("kubetest: adding user %s: %v", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return &User{Name: name, Config: u.Config(), Kubeconfig: path}
}

// ServerVersion is the API server's gitVersion (discovery's /version).
func (e *Env) ServerVersion() (string, error) {
	v, err := e.Clientset.Discovery().ServerVersion()
	if err != nil {
		return "", err
	}
	return v.GitVersion, nil
}

// BinaryVersion is what `kube-apiserver --version` prints, for messages.
func BinaryVersion() string {
	out, _ := exec.Command(filepath.Join(AssetsDir(), "kube-apiserver"), "--version").Output()
	return strings.TrimSpace(string(out))
}
