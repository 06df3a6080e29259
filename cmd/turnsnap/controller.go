package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/turnsnap/turnsnap/kube/controller"
	"github.com/turnsnap/turnsnap/server"
)

type controllerFlags struct {
	kubeconfig  string
	opts        controller.Options
	leaderElect bool
	metrics     string
	probes      string
	logFormat   string
}

func (a *app) controllerCmd() *cobra.Command {
	var f controllerFlags
	c := &cobra.Command{
		Use:   "controller [--namespace NS] [--kubeconfig F]",
		Short: "Run the Kubernetes controller of turnsnap.dev sandboxes, checkpoints and forks over the node agents",
		Long: `controller reconciles the turnsnap.dev/v1alpha1 resources (docs/KUBERNETES.md):
TurnsnapSandbox (placed on a node agent, suspended to the bucket, resumed
anywhere, restored elsewhere when its node's Lease expires), SandboxCheckpoint
and SandboxFork. It finds the node agents by their Leases and Secrets
turnsnap-node-NAME in --namespace and calls each over TCP with its token.

When agent-sandbox's Sandbox CRD (agents.x-k8s.io) is installed at start,
a Sandbox that opts in (annotation turnsnap.dev/managed: "true" or runtime
class turnsnap) gets a TurnsnapSandbox it owns, suspended and resumed with
its spec.operatingMode.

It uses the in-cluster configuration, or --kubeconfig (env KUBECONFIG).
It needs no root and no turnsnap home.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.controller(cmd.Context(), f) },
	}
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "turnsnap-system"
	}
	fl := c.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or env KUBECONFIG)")
	fl.StringVar(&f.opts.Namespace, "namespace", ns, "namespace of the node agents' Leases and Secrets (env POD_NAMESPACE)")
	fl.IntVar(&f.opts.NodeCapacity, "node-capacity", 0, "sandboxes one node takes at most (0: no bound)")
	fl.IntVar(&f.opts.Workers, "workers", 8, "reconciles of one resource kind that run at once")
	fl.DurationVar(&f.opts.NodeTimeout, "node-timeout", 0, "bound on one call to a node agent (0: 5m)")
	fl.BoolVar(&f.leaderElect, "leader-elect", false, "run only while holding the leader Lease (several replicas)")
	fl.StringVar(&f.metrics, "metrics-address", "0", "serve controller metrics on ADDR (0: off)")
	fl.StringVar(&f.probes, "probe-address", "", "serve /healthz and /readyz on ADDR")
	fl.StringVar(&f.logFormat, "log-format", "text", "log lines as text or json (on stderr)")
	return c
}

func (a *app) controller(ctx context.Context, f controllerFlags) error {
	log, err := server.NewLogger(f.logFormat, false) // as serve logs
	if err != nil {
		return err
	}
	ctrl.SetLogger(controller.Logger(log))
	cfg, err := ctrl.GetConfig()
	if f.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("controller: Kubernetes configuration: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  controller.Scheme(),
		Cache:                   controller.CacheOptions(f.opts.Namespace),
		Metrics:                 metricsserver.Options{BindAddress: f.metrics},
		HealthProbeBindAddress:  f.probes,
		LeaderElection:          f.leaderElect,
		LeaderElectionID:        "turnsnap-controller",
		LeaderElectionNamespace: f.opts.Namespace,
	})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if f.probes != "" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
			return err
		}
	}
	f.opts.Log = log
	if err := controller.Setup(mgr, f.opts); err != nil {
		return err
	}
	log.Info("controller starting", "namespace", f.opts.Namespace)
	return mgr.Start(ctx)
}
