package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/turnsnap/turnsnap/client"
	"github.com/turnsnap/turnsnap/internal/kubetest"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	kubenode "github.com/turnsnap/turnsnap/kube/node"
)

// The tests run a real kube-apiserver and etcd (envtest), real node
// agents (`turnsnap serve` on TCP, one home each, one MinIO bucket) and the
// controller in this process. There is no kubelet: the test plays the part
// of kube/node on each node (the Lease turnsnap-node-NAME it renews and the
// Secret with its endpoint and token) and of the kubelet (Node objects).

// leaseSeconds is the node Leases' duration here: short, so that a dead
// node is noticed within seconds.
const leaseSeconds = 2

// repoRoot is the module's root (this file is kube/controller/...).
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// turnsnapBin returns the binary the node agents run: TURNSNAP_BIN when
// `make test` built one, else one built into the test's temp dir.
func turnsnapBin(t testing.TB) string {
	if b := os.Getenv("TURNSNAP_BIN"); b != "" {
		if _, err := os.Stat(b); err == nil {
			return b
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "turnsnap")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/turnsnap/turnsnap/cmd/turnsnap")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building turnsnap: %v\n%s", err, out)
	}
	return bin
}

// fleet is the API server, the bucket, the node agents and the controller.
type fleet struct {
	t   testing.TB
	dir string
	ns  string
	cfg *rest.Config
	k   crclient.Client
	api *kubetest.Env
	// ctrlCfg, if set, is the controller's identity instead of cfg's
	// (asController: the ServiceAccount of deploy/kubernetes/rbac.yaml).
	ctrlCfg *rest.Config
	minio   *miniotest.Server
	bin     string
	base    string
	agents  []*agent

	// log is the controller's log, in DIR/controller.log (a goroutine
	// must not log through t after the test ended).
	log *slog.Logger

	mu       sync.Mutex
	stopCtrl context.CancelFunc
	ctrlDone chan error
}

// agent is one node: its home, its daemon, and the test's stand-in for
// kube/node renewing its Lease.
type agent struct {
	f      *fleet
	name   string
	home   string
	homeID string
	addr   string
	token  string
	log    string
	c      *client.Client

	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
	stopLease context.CancelFunc
	leaseDone chan struct{}
}

// newFleet starts the API server with turnsnap's CRDs and those of
// crdDirs, the bucket and nodes node agents.
func newFleet(t testing.TB, nodes int, crdDirs ...string) *fleet {
	testenv.RequireRoot(t)
	f := &fleet{t: t, dir: t.TempDir(), ns: "turnsnap-system"}
	t.Cleanup(func() { unmountUnder(t, f.dir) })
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
	f.minio = miniotest.Start(t)
	logf, err := os.Create(filepath.Join(f.dir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	f.log = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	f.bin = turnsnapBin(t)
	ctx := context.Background()
	for _, ns := range []string{f.ns, "work"} {
		if err := f.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	f.base = makeBase(t, f.dir)
	for i := 1; i <= nodes; i++ {
		a := f.newAgent(ctx, fmt.Sprintf("n%d", i))
		f.agents = append(f.agents, a)
	}
	return f
}

func (f *fleet) newAgent(ctx context.Context, name string) *agent {
	t := f.t
	a := &agent{f: f, name: name, home: filepath.Join(f.dir, name, "home"), log: filepath.Join(f.dir, name, "daemon.log")}
	if err := os.MkdirAll(filepath.Dir(a.home), 0o755); err != nil {
		t.Fatal(err)
	}
	a.token = randomHex(16)
	if err := os.WriteFile(filepath.Join(f.dir, name, "token"), []byte(a.token), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	a.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	out, err := a.cli(ctx, "init", "--remote", "s3://kube", "--endpoint", f.minio.Endpoint, "--insecure")
	if err != nil {
		t.Fatalf("%s: init: %v\n%s", name, err, out)
	}
	a.homeID = readHomeID(t, a.home)
	a.c, err = client.New(client.Options{URL: "http://" + a.addr, Token: a.token})
	if err != nil {
		t.Fatal(err)
	}
	if f.k != nil {
		// The kubelet's part: a Node object, labelled.
		kn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"turnsnap.dev/node": name}}}
		if err := f.k.Create(ctx, kn); err != nil {
			t.Fatal(err)
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: NodeObjectPrefix + name, Namespace: f.ns},
			Data: map[string][]byte{kubenode.SecretEndpoint: []byte("http://" + a.addr), kubenode.SecretToken: []byte(a.token)}}
		if err := f.k.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { a.kill() })
	if err := a.start(ctx); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *agent) env() []string {
	return append(os.Environ(), "AWS_ACCESS_KEY_ID="+a.f.minio.AccessKey, "AWS_SECRET_ACCESS_KEY="+a.f.minio.SecretKey)
}

func (a *agent) cli(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, a.f.bin, append([]string{"--home", a.home, "--json"}, args...)...)
	cmd.Env = a.env()
	return cmd.CombinedOutput()
}

// start starts the daemon, waits until it answers, and starts renewing
// the node's Lease (kube/node's part).
func (a *agent) start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	logf, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(a.f.bin, "--home", a.home, "--lock-wait", "60s", "serve", "--listen", a.addr,
		"--token-file", filepath.Join(filepath.Dir(a.home), "token"))
	cmd.Env = a.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := a.c.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-done:
			return fmt.Errorf("%s: turnsnap serve exited at start; see %s", a.name, a.log)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s: turnsnap serve does not answer: %v; see %s", a.name, err, a.log)
		}
		time.Sleep(50 * time.Millisecond) // the daemon has no readiness signal but its answer
	}
	a.cmd, a.done = cmd, done
	if a.f.k == nil {
		return nil // no API server: no Lease
	}
	lctx, stop := context.WithCancel(context.Background())
	a.stopLease, a.leaseDone = stop, make(chan struct{})
	if err := a.renew(ctx); err != nil {
		return err
	}
	go a.renewing(lctx, a.leaseDone)
	return nil
}

// renewing renews the node's Lease every half second while the daemon
// lives (kube/node's part).
func (a *agent) renewing(ctx context.Context, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := a.renew(ctx); err != nil && ctx.Err() == nil {
				a.f.t.Logf("%s: renewing its lease: %v", a.name, err)
			}
		}
	}
}

func (a *agent) renew(ctx context.Context) error {
	k := a.f.k
	now := metav1.NewMicroTime(time.Now())
	d := int32(leaseSeconds)
	var l coordinationv1.Lease
	err := k.Get(ctx, crclient.ObjectKey{Namespace: a.f.ns, Name: NodeObjectPrefix + a.name}, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: NodeObjectPrefix + a.name, Namespace: a.f.ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &a.homeID, LeaseDurationSeconds: &d, RenewTime: &now, AcquireTime: &now}}
		return k.Create(ctx, &l)
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &a.homeID, &d, &now
	return k.Update(ctx, &l)
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
	if a.cmd != nil {
		a.cmd.Process.Kill()
		<-a.done
		a.cmd = nil
	}
}

// startController runs the controller in this process until stopController.
func (f *fleet) startController() {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A restarted controller is a new manager in this process: its
	// controllers' names are those of the stopped one.
	skip := true
	cfg := f.cfg
	if f.ctrlCfg != nil {
		cfg = f.ctrlCfg
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: Scheme(), Cache: CacheOptions(f.ns), Metrics: metricsserver.Options{BindAddress: "0"},
		Logger: Logger(f.log), Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := Setup(mgr, Options{Namespace: f.ns, Log: f.log, NodeTimeout: 2 * time.Minute}); err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	f.stopCtrl, f.ctrlDone = cancel, done
	f.t.Cleanup(f.stopController)
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

func readHomeID(t testing.TB, home string) string {
	b, err := os.ReadFile(filepath.Join(home, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, `"home_id"`)
	if i < 0 {
		t.Fatalf("%s/config.json has no home_id", home)
	}
	rest := s[i+len(`"home_id"`):]
	j := strings.Index(rest, `"`)
	k := strings.Index(rest[j+1:], `"`)
	return rest[j+1 : j+1+k]
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// unmountUnder detaches every mount under dir (sandbox roots the daemons
// left mounted), deepest first, before the temp dir is removed.
func unmountUnder(t testing.TB, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if p := f[4]; p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			t.Logf("cleanup: unmounting %s: %v", p, err)
		}
	}
}
