package node

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/turnsnap/turnsnap/internal/kubetest"
)

// The agent against a real API server (internal/kubetest): what it
// registers, that it renews, that it releases, and that a name held by
// another live home is not taken until that home stops renewing.

const testLease = 3 * time.Second // the shortest the agent accepts: renewals every second

func newNamespace(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tsnode-"}}
	got, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Name
}

func testAgent(t *testing.T, cs kubernetes.Interface, ns, node, home string) *Agent {
	t.Helper()
	a, err := New(Config{Client: cs, Namespace: ns, Node: node, HomeID: home,
		Endpoint: "https://10.0.0.7:7443", Token: []byte("tok-" + home), CA: []byte("PEM-" + home),
		LeaseDuration: testLease, Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func getLease(t *testing.T, cs kubernetes.Interface, ns, node string) *coordv1.Lease {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), LeaseName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// runAgent runs a.Run until the returned stop is called.
func runAgent(a *Agent) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Run(ctx) }()
	return func() { cancel(); wg.Wait() }
}

func TestRegisterRenewRelease(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	cs := env.Clientset
	ns := newNamespace(t, cs)
	ctx := context.Background()

	a := testAgent(t, cs, ns, "n1", "home-a")
	if err := a.Register(ctx); err != nil {
		t.Fatal(err)
	}
	l := getLease(t, cs, ns, "n1")
	if Holder(l) != "home-a" || deref(l.Spec.LeaseDurationSeconds) != 3 || l.Spec.RenewTime == nil {
		t.Fatalf("Lease after Register: holder %q, duration %d, renewTime %v", Holder(l), deref(l.Spec.LeaseDurationSeconds), l.Spec.RenewTime)
	}
	if got := l.Annotations[AnnotationEndpoint]; got != "https://10.0.0.7:7443" {
		t.Errorf("endpoint annotation %q", got)
	}
	if l.Labels[LabelNode] != "n1" {
		t.Errorf("Lease labels %v", l.Labels)
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, SecretName("n1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{SecretToken: "tok-home-a", SecretEndpoint: "https://10.0.0.7:7443", SecretCA: "PEM-home-a", SecretHomeID: "home-a"} {
		if !bytes.Equal(s.Data[k], []byte(want)) {
			t.Errorf("Secret %s = %q, want %q", k, s.Data[k], want)
		}
	}

	// Renewal: renewTime moves forward, about every second.
	stop := runAgent(a)
	first := l.Spec.RenewTime.Time
	seen := map[time.Time]bool{}
	deadline := time.Now().Add(6 * testLease)
	for len(seen) < 3 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if rt := getLease(t, cs, ns, "n1").Spec.RenewTime.Time; rt.After(first) {
			seen[rt] = true
		}
	}
	stop()
	if len(seen) < 3 {
		t.Fatalf("renewTime moved %d times in %v, want 3 (renewals every %v)", len(seen), 6*testLease, testLease/3)
	}

	// A clean stop releases: no holder, so another home takes it at once.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l := getLease(t, cs, ns, "n1"); Holder(l) != "" || deref(l.Spec.LeaseDurationSeconds) != 1 {
		t.Fatalf("after Release: holder %q, duration %d s; want none, 1", Holder(l), deref(l.Spec.LeaseDurationSeconds))
	}
	b := testAgent(t, cs, ns, "n1", "home-b")
	rctx, cancel := context.WithTimeout(ctx, testLease/2)
	defer cancel()
	if err := b.Register(rctx); err != nil {
		t.Fatalf("a released Lease was not taken at once: %v", err)
	}
	l = getLease(t, cs, ns, "n1")
	if Holder(l) != "home-b" || deref(l.Spec.LeaseTransitions) != 1 {
		t.Fatalf("after the second home: holder %q, transitions %d", Holder(l), deref(l.Spec.LeaseTransitions))
	}
	// The first home, its Lease gone to another, renews no more.
	if err := a.renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renew of a Lease another home holds: %v, want ErrLeaseLost", err)
	}
}

// A live holder keeps its name; once it stops renewing (a crash: no
// Release), the other home takes it after a lease duration.
func TestLiveLeaseNotTaken(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	cs := env.Clientset
	ns := newNamespace(t, cs)
	ctx := context.Background()

	a := testAgent(t, cs, ns, "n2", "home-a")
	if err := a.Register(ctx); err != nil {
		t.Fatal(err)
	}
	stopA := runAgent(a)
	b := testAgent(t, cs, ns, "n2", "home-b")
	got := make(chan error, 1)
	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	go func() { got <- b.Register(bctx) }()

	// Two lease durations of renewals: b must still be waiting.
	select {
	case err := <-got:
		t.Fatalf("the second home registered while the first renewed (err %v); holder %q", err, Holder(getLease(t, cs, ns, "n2")))
	case <-time.After(2 * testLease):
	}
	if h := Holder(getLease(t, cs, ns, "n2")); h != "home-a" {
		t.Fatalf("holder %q while home-a renews", h)
	}

	stopA() // a crash: renewals stop, nothing released
	stoppedAt := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * testLease):
		t.Fatalf("the second home did not take a Lease unrenewed for %v", 4*testLease)
	}
	took := time.Since(stoppedAt)
	l := getLease(t, cs, ns, "n2")
	if Holder(l) != "home-b" || deref(l.Spec.LeaseTransitions) != 1 {
		t.Fatalf("after expiry: holder %q, transitions %d", Holder(l), deref(l.Spec.LeaseTransitions))
	}
	// It waited for expiry, not less: at least a lease duration minus
	// the one renewal interval the last renewal may have come before the stop.
	if took < testLease-testLease/3 {
		t.Fatalf("the second home took the Lease %v after the holder stopped: before it expired (%v)", took, testLease)
	}
	t.Logf("taken %v after the holder stopped renewing (lease %v)", took.Round(time.Millisecond), testLease)
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := Config{Client: &kubernetes.Clientset{}, Namespace: "ns", Node: "n", HomeID: "h", Endpoint: "https://x:1", Token: []byte("t")}
	for name, mut := range map[string]func(*Config){
		"no client":        func(c *Config) { c.Client = nil },
		"no node":          func(c *Config) { c.Node = "" },
		"bad node":         func(c *Config) { c.Node = "Bad_Name" },
		"bad namespace":    func(c *Config) { c.Namespace = "a.b" },
		"no token":         func(c *Config) { c.Token = nil },
		"short lease":      func(c *Config) { c.LeaseDuration = 2 * time.Second },
		"fractional lease": func(c *Config) { c.LeaseDuration = 3500 * time.Millisecond },
	} {
		c := good
		mut(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(good); err != nil {
		t.Fatalf("a good config: %v", err)
	}
}
