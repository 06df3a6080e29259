package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/fleethost"
	"github.com/turnsnap/turnsnap/internal/kubetest"
	"github.com/turnsnap/turnsnap/internal/loopfs"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	kubenode "github.com/turnsnap/turnsnap/kube/node"
)

// The tests run a real kube-apiserver and etcd (envtest), real node
// agents (`turnsnap serve` on TCP, one home each, one MinIO bucket) and the
// controller in this process. There is no kubelet: the test runs kube/node's
// Agent for each node in this process (the Lease turnsnap-node-NAME it
// renews and the Secret with its endpoint and token) and plays the
// kubelet's part (Node objects).

// leaseSeconds is the node Leases' duration here: short, so that a dead
// node is noticed within seconds (kube/node's least: renewals every second).
const leaseSeconds = 3

// repoRoot is the module's root (this file is kube/controller/...).
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// fleet is the API server, the bucket, the node agents and the controller.
type fleet struct {
	t   testing.TB
	dir string
	ns  string
	cfg *rest.Config
	k   crclient.Client
	cs  kubernetes.Interface // kube/node's client
	api *kubetest.Env
	// ctrlCfg, if set, is the controller's identity instead of cfg's
	// (asController: the ServiceAccount of deploy/kubernetes/rbac.yaml).
	ctrlCfg *rest.Config
	minio   *miniotest.Server
	bin     string
	base    string
	agents  []*agent
	// diskSize: each node's own ext4 (fleetOptions)
	diskSize int64

	// log is the controller's log, in DIR/controller.log (a goroutine
	// must not log through t after the test ended).
	log *slog.Logger

	mu       sync.Mutex
	stopCtrl context.CancelFunc
	ctrlDone chan error
}

// agent is one node: its host (home and daemon, internal/fleethost) and
// kube/node's Agent registering it (its Secret and renewed Lease).
type agent struct {
	f      *fleet
	name   string
	h      *fleethost.Host
	homeID string
	addr   string
	token  string
	c      *client.Client // the daemon's API over TCP, as the controller calls it

	mu        sync.Mutex
	stopLease context.CancelFunc
	leaseDone chan struct{}
}

// newFleet starts the API server with turnsnap's CRDs and those of
// crdDirs, the bucket and nodes node agents.
func newFleet(t testing.TB, nodes int, crdDirs ...string) *fleet {
	return newFleetWith(t, fleetOptions{nodes: nodes, crdDirs: crdDirs})
}

// fleetOptions: diskSize > 0 gives each node agent an ext4 of that size of
// its own (internal/loopfs) for its home, as nodes have their own disks:
// on one shared ext4 a node's removals slow the next node's file creates
// (ext4 skips inodes freed in the last minutes when it allocates).
type fleetOptions struct {
	nodes    int
	crdDirs  []string
	diskSize int64
}

func newFleetWith(t testing.TB, o fleetOptions) *fleet {
	nodes, crdDirs := o.nodes, o.crdDirs
	testenv.RequireRoot(t)
	f := &fleet{t: t, dir: t.TempDir(), ns: "turnsnap-system", diskSize: o.diskSize}
	t.Cleanup(func() { fleethost.UnmountUnder(t, f.dir) })
	// controller-runtime's global logger, which envtest's own clients use
	// (unset, it prints a stack trace); the managers get theirs.
	ctrl.SetLogger(logr.Discard())
	// The API server first: without its binaries there is nothing to run.
	scheme := Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	api := kubetest.Start(t, kubetest.Options{Scheme: scheme, CRDDirs: append([]string{filepath.Join(repoRoot(t), "deploy", "kubernetes", "crd")}, crdDirs...)})
	f.cfg, f.k, f.api = api.Config, api.Client, api
	cs, err := kubernetes.NewForConfig(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.cs = cs
	f.minio = miniotest.Start(t)
	logf, err := os.Create(filepath.Join(f.dir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	f.log = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	f.bin = fleethost.TurnsnapBin(t)
	ctx := context.Background()
	for _, ns := range []string{f.ns, "work"} {
		if err := f.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	f.base = makeBase(t, f.dir)
	for i := 1; i <= nodes; i++ {
		f.agents = append(f.agents, f.newAgent(ctx, i))
	}
	return f
}

// newAgent makes node nI: a host with its home on the bucket, serving
// TCP with a token, and (with an API server) its Node object.
func (f *fleet) newAgent(ctx context.Context, i int) *agent {
	t := f.t
	env := []string{"AWS_ACCESS_KEY_ID=" + f.minio.AccessKey, "AWS_SECRET_ACCESS_KEY=" + f.minio.SecretKey}
	dir := f.dir
	if f.diskSize > 0 {
		// The host's directory (dir/hI) on a disk of its own.
		mnt := loopfs.Mount(t, "ext4", f.diskSize, "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0")
		t.Cleanup(func() { fleethost.UnmountUnder(t, mnt) }) // the sandboxes' roots, before the disk goes
		dir = filepath.Join(mnt, "node")
	}
	h := fleethost.NewHost(t, nil, i, f.bin, dir, env)
	a := &agent{f: f, name: fmt.Sprintf("n%d", i), h: h, token: randomHex(16)}
	h.Name = a.name
	tokenFile := filepath.Join(h.Dir(), "token")
	if err := os.WriteFile(tokenFile, []byte(a.token), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := testenv.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	a.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	h.ServeArgs = []string{"--listen", a.addr, "--token-file", tokenFile}
	if err := h.InitRemote(ctx, "s3://kube", f.minio.Endpoint); err != nil {
		t.Fatal(err)
	}
	a.homeID = h.HomeID
	a.c, err = client.New(client.Options{URL: "http://" + a.addr, Token: a.token})
	if err != nil {
		t.Fatal(err)
	}
	if f.k != nil {
		// The kubelet's part: a Node object, labelled.
		kn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.name, Labels: map[string]string{"turnsnap.dev/node": a.name}}}
		if err := f.k.Create(ctx, kn); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(a.kill)
	if err := a.start(ctx); err != nil {
		t.Fatal(err)
	}
	return a
}

// start starts the daemon, waits until it answers, and (with an API
// server) runs kube/node's Agent: it writes the node's Secret, acquires the
// Lease and renews it until kill.
func (a *agent) start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.h.Start(ctx); err != nil {
		return err
	}
	if a.f.cs == nil {
		// No API server (none, or fakeAPI's client, whose Leases the
		// test writes itself): no kube/node Agent.
		return nil
	}
	na, err := kubenode.New(kubenode.Config{Client: a.f.cs, Namespace: a.f.ns, Node: a.name, HomeID: a.homeID,
		Endpoint: "http://" + a.addr, Token: []byte(a.token), LeaseDuration: leaseSeconds * time.Second, Log: a.f.log})
	if err != nil {
		return err
	}
	if err := na.Register(ctx); err != nil {
		return err
	}
	lctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.stopLease, a.leaseDone = stop, done
	go func() {
		defer close(done)
		if err := na.Run(lctx); err != nil {
			a.f.log.Error("renewing the node's Lease", "node", a.name, "err", err)
		}
	}()
	return nil
}

// kill SIGKILLs the daemon and stops renewing its Lease, as a node that
// died would. It returns when the daemon is gone.
func (a *agent) kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopLease != nil {
		a.stopLease()
		<-a.leaseDone
		a.stopLease = nil
	}
	a.h.Kill()
}

// startController runs the controller in this process until stopController.
func (f *fleet) startController() {
	f.mu.Lock()
	defer f.mu.Unlock()
	cfg := f.cfg
	if f.ctrlCfg != nil {
		cfg = f.ctrlCfg
	}
	f.stopCtrl, f.ctrlDone = runManager(f.t, cfg, f.ns, f.log)
	f.t.Cleanup(f.stopController)
}

// runManager starts the controller as a manager in this process, with
// cfg's identity, over the node agents in namespace ns; cancel stops it,
// and done then gives mgr.Start's answer.
func runManager(t testing.TB, cfg *rest.Config, ns string, log *slog.Logger) (cancel context.CancelFunc, done chan error) {
	// A restarted controller is a new manager in this process: its
	// controllers' names are those of the stopped one.
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: Scheme(), Cache: CacheOptions(ns), Metrics: metricsserver.Options{BindAddress: "0"},
		Logger: Logger(log), Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Setup(mgr, Options{Namespace: ns, Log: log, NodeTimeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return cancel, done
}

// asController has the controller run as the ServiceAccount of
// deploy/kubernetes/rbac.yaml, whose objects it applies for real: a rule
// missing there fails the test.
func (f *fleet) asController() {
	objs, err := kubetest.ReadManifestFile(filepath.Join(repoRoot(f.t), "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		f.t.Fatal(err)
	}
	if err := kubetest.Create(context.Background(), f.k, objs, false); err != nil {
		f.t.Fatal(err)
	}
	u := f.api.AddUser(f.t, "system:serviceaccount:"+f.ns+":turnsnap-controller", "system:serviceaccounts", "system:serviceaccounts:"+f.ns)
	f.ctrlCfg = u.Config
}

// stopController stops the controller and waits until it has.
func (f *fleet) stopController() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopCtrl == nil {
		return
	}
	f.stopCtrl()
	if err := <-f.ctrlDone; err != nil {
		f.t.Logf("controller stopped: %v", err)
	}
	f.stopCtrl = nil
}

// agentNamed returns the node's agent.
func (f *fleet) agentNamed(name string) *agent {
	for _, a := range f.agents {
		if a.name == name {
			return a
		}
	}
	f.t.Fatalf("no node %s", name)
	return nil
}

// waitFor polls get until done says so, or fails the test after d.
func waitFor[T crclient.Object](t testing.TB, f *fleet, obj T, name string, d time.Duration, done func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f.k.Get(context.Background(), crclient.ObjectKey{Namespace: "work", Name: name}, obj)
		if err == nil && done(obj) {
			return obj
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting %v for %s: %v; last seen: %+v", d, name, err, obj)
		}
		time.Sleep(100 * time.Millisecond) // polling the API server, as a client would
	}
}

// makeBase is the sandboxes' base: a small project tree.
func makeBase(t testing.TB, dir string) string {
	base := filepath.Join(dir, "base")
	files := map[string]string{
		"README.md":        "kube base\n",
		"src/main.go":      "package main\n\nfunc main() {}\n",
		"data/config.json": `{"kube": true}` + "\n",
	}
	for name, body := range files {
		p := filepath.Join(base, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return base
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
