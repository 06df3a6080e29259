package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/kube/node"
	"github.com/turnsnap/turnsnap/kube/snapshot"
	"github.com/turnsnap/turnsnap/server"
	"github.com/turnsnap/turnsnap/server/tenants"
)

// serveFlags are serve's flags: the daemon's configuration (package
// server), and the tenants file that serves several homes instead of one.
type serveFlags struct {
	cfg     server.Config
	tenants string
	// snapshotGRPC is --snapshot-grpc: the EXPERIMENTAL KEP-0694 snapshot
	// provider's address (package kube/snapshot).
	snapshotGRPC string
	kube         node.DaemonOptions
}

func (a *app) serveCmd() *cobra.Command {
	var f serveFlags
	c := &cobra.Command{
		Use:   "serve [--listen ADDR --token-file F [--tls-cert C --tls-key K]] [--socket-group G]",
		Short: "Run the daemon: serve this home's API on HOME/turnsnap.sock (and TCP), upload in the background",
		Long: `serve opens the home once and keeps it (its lock, catalog, store and process
runtime) for its lifetime, serving the HTTP API (docs/openapi.yaml) on the
unix socket HOME/turnsnap.sock (mode 0600; --socket-group G makes it 0660
for group G). Every turnsnap command on this home then goes through it.

--listen ADDR also serves TCP; every request there needs the header
"Authorization: Bearer TOKEN" with the token in --token-file. A non-loopback
ADDR is refused without --tls-cert and --tls-key.

--forget-interval DUR applies the retention policies stored with 'policy
set' every DUR (as 'policy apply' does; default off), logging what each run
deleted and counting it in turnsnap_forgotten_checkpoints_total. Run
'turnsnap gc' to reclaim the space.

With a remote store, the queue is uploaded continuously in the background;
sync and checkpoint --wait-remote wait for it. At start it repairs what a
killed turnsnap left (frozen containers, half-done rollbacks) and resumes the
upload queue. SIGTERM or SIGINT: stop accepting, let requests in flight
finish (a checkpoint commits), leave sandboxes and their processes running,
exit 0.

--tenants FILE serves several homes, one per tenant, on one --listen
address: each request's bearer token picks its tenant's home, and nothing
of another tenant can be named with it (docs/SECURITY.md, "Tenants").
Each home also gets its own unix socket; --home is not used.

--checkpoint-slots N bounds the checkpoints that scan and store at once
(default one per CPU); the others queue in arrival order, except those whose
model reply is already waiting at the LLM proxy's gate, which go first
(turnsnap_checkpoint_queue_* on /metrics).

--llm-listen 127.0.0.1:PORT also serves the LLM proxy (docs/LLM-PROXY.md) at
http://ADDR/llm/{sandbox}/: each model call an agent sends there is forwarded
to the upstream (--llm-upstream, or the sandbox's own) and closes the
sandbox's turn, checkpointed during the model's latency; the reply waits for
the checkpoint (--llm-gate). turnsnap run NAME -- AGENT starts an agent
pointed at it.

--kube-node NAME registers the daemon with a Kubernetes API server as the
turnsnap node NAME (docs/KUBERNETES.md): a coordination.k8s.io Lease
turnsnap-node-NAME held by this home's id and renewed every third of
--kube-lease-duration while serving, released on SIGTERM, and a Secret
turnsnap-node-NAME with the endpoint, the --token-file token and the
--tls-cert certificate, for the controller. It needs --listen; a missing
--token-file, --tls-cert or --tls-key file is made (a random token, a
self-signed certificate) and kept for the next start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.serve(cmd.Context(), f) },
	}
	fl := c.Flags()
	fl.StringVar(&f.cfg.SocketGroup, "socket-group", "", "make the socket 0660 for this group (name or gid)")
	fl.DurationVar(&f.cfg.ForgetInterval, "forget-interval", 0, "apply the stored retention policies (policy set) this often, as 'policy apply' does (0: never)")
	fl.StringVar(&f.cfg.Listen, "listen", "", "also serve TCP on ADDR (HOST:PORT), with --token-file")
	fl.StringVar(&f.cfg.TokenFile, "token-file", "", "file holding the bearer token TCP clients must send")
	fl.StringVar(&f.cfg.TLSCert, "tls-cert", "", "TLS certificate (PEM) for --listen")
	fl.StringVar(&f.cfg.TLSKey, "tls-key", "", "TLS private key (PEM) for --listen")
	fl.StringVar(&f.cfg.LogFormat, "log-format", "text", "log lines as text or json (on stderr)")
	fl.StringVar(&f.tenants, "tenants", "", "serve several homes, one per tenant, as FILE lists them (with --listen; see docs/SECURITY.md)")
	fl.DurationVar(&f.cfg.ShutdownTimeout, "shutdown-timeout", 5*time.Minute, "on SIGTERM, how long requests in flight may take to finish")
	fl.DurationVar(&f.cfg.LeaseTTL, "lease-ttl", delta.DefaultLeaseTTL, "host lease TTL in the shared bucket: renewed every third of it; another home adopts this one's sandboxes without --force only once it lapses")
	fl.IntVar(&f.cfg.EventRing, "event-ring", server.DefaultEventRing, "recent events kept for /v1/events clients that resume with Last-Event-ID (one away longer gets a gap event)")
	fl.IntVar(&f.cfg.CheckpointSlots, "checkpoint-slots", 0, "checkpoints that run at once, the others queue (urgent ones, whose model reply waits, first); 0: one per CPU, -1: no limit")
	fl.StringVar(&f.snapshotGRPC, "snapshot-grpc", "", "EXPERIMENTAL: also serve the agent-sandbox KEP-0694 snapshot provider (gRPC Checkpoint/Restore/Delete) on an absolute unix socket path, or on loopback HOST:PORT with --token-file's bearer token (docs/SNAPSHOT-GRPC.md)")
	registerLLMFlags(fl, &f.cfg.LLM)
	registerKubeNodeFlags(fl, &f.kube)
	return c
}

// serve runs the daemon (package server; server/tenants for --tenants)
// with the flags and the global options.
func (a *app) serve(ctx context.Context, f serveFlags) error {
	cfg := f.cfg
	cfg.Home, cfg.LockWait, cfg.Verbose = a.home, a.lockWait, a.verbose
	cfg.AtPhase = blockAtPhase()
	cfg.MCP = mcpHandler
	if f.snapshotGRPC != "" {
		if f.tenants != "" {
			return fmt.Errorf("serve: --snapshot-grpc serves one home, not --tenants: %w", errdefs.ErrInvalid)
		}
		ep, err := snapshot.ParseEndpoint(f.snapshotGRPC, cfg.TokenFile)
		if err != nil {
			return err
		}
		cfg.Attach = append(cfg.Attach, ep.Attachment())
	}
	if f.tenants != "" {
		if f.kube.Node != "" {
			return fmt.Errorf("--kube-node serves one home, not --tenants: %w", errdefs.ErrInvalid)
		}
		return tenants.Serve(ctx, cfg, f.tenants)
	}
	if f.kube.Node != "" {
		release, err := a.withKubeNode(&cfg, f.kube)
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInvalid)
		}
		defer release()
	}
	return server.Serve(ctx, cfg)
}
