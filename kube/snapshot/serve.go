package snapshot

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	pb "github.com/turnsnap/turnsnap/kube/snapshot/v1alpha1"
	"github.com/turnsnap/turnsnap/server"
)

// Endpoint is where the provider listens: a unix socket (mode 0600, so
// only root reaches it, as the daemon's own socket) or a loopback TCP
// address whose every call carries the daemon's bearer token.
type Endpoint struct {
	Unix  string // socket path, or
	TCP   string // HOST:PORT on loopback
	token []byte
}

// ParseEndpoint reads --snapshot-grpc: "unix:PATH" or an absolute PATH is
// a unix socket; HOST:PORT is TCP, on loopback only (no TLS here, and the
// token must not cross the network in clear) and only with the daemon's
// --token-file.
func ParseEndpoint(addr, tokenFile string) (*Endpoint, error) {
	bad := func(why string) error {
		return fmt.Errorf("serve: --snapshot-grpc %q: %s: %w", addr, why, errdefs.ErrInvalid)
	}
	if p, ok := strings.CutPrefix(addr, "unix:"); ok || filepath.IsAbs(addr) {
		if !ok {
			p = addr
		}
		if !filepath.IsAbs(p) {
			return nil, bad("a unix socket path must be absolute")
		}
		if len(p) >= 108 {
			return nil, bad("the socket path is longer than 107 bytes")
		}
		return &Endpoint{Unix: p}, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, bad("want an absolute unix socket path or HOST:PORT")
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, bad("TCP is served on loopback only (127.0.0.1 or [::1])")
	}
	if tokenFile == "" {
		return nil, bad("TCP needs the daemon's bearer token (--listen with --token-file)")
	}
	tok, err := server.ReadToken(tokenFile)
	if err != nil {
		return nil, err
	}
	return &Endpoint{TCP: addr, token: tok}, nil
}

// Listen opens the endpoint. A stale socket file is replaced.
func (ep *Endpoint) Listen() (net.Listener, error) {
	if ep.TCP != "" {
		l, err := net.Listen("tcp", ep.TCP)
		if err != nil {
			return nil, fmt.Errorf("serve: --snapshot-grpc: %w", err)
		}
		return l, nil
	}
	if err := os.Remove(ep.Unix); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("serve: --snapshot-grpc: stale socket %s: %w", ep.Unix, err)
	}
	l, err := net.Listen("unix", ep.Unix)
	if err != nil {
		return nil, fmt.Errorf("serve: --snapshot-grpc: %w", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(ep.Unix, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("serve: --snapshot-grpc: %w", err)
	}
	return l, nil
}

// NewGRPCServer is a gRPC server serving p; with a token every call must
// carry "authorization: Bearer TOKEN" (compared in constant time), or is
// refused Unauthenticated before it reaches the service.
func NewGRPCServer(p *Provider, token []byte, log *slog.Logger) *grpc.Server {
	var opts []grpc.ServerOption
	if token != nil {
		want := append([]byte("Bearer "), token...)
		opts = append(opts, grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			got := md.Get("authorization")
			if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), want) != 1 {
				log.Warn("snapshot provider: call refused: missing or wrong bearer token", "method", info.FullMethod)
				return nil, status.Error(codes.Unauthenticated, "missing or wrong bearer token")
			}
			return h(ctx, req)
		}))
	}
	g := grpc.NewServer(opts...)
	pb.RegisterSnapshotDriverServer(g, p)
	return g
}

// Attachment is the server.Attachment that serves the provider at ep on
// the daemon's service, until the daemon stops: calls in flight finish
// (a checkpoint commits) while the daemon's shutdown timeout lasts.
func (ep *Endpoint) Attachment() server.Attachment {
	return func(ctx context.Context, svc *server.Service, log *slog.Logger) (func(context.Context), error) {
		l, err := ep.Listen()
		if err != nil {
			return nil, err
		}
		g := NewGRPCServer(NewProvider(svc), ep.token, log)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := g.Serve(l); err != nil {
				log.Error("snapshot provider (experimental) stopped serving", "err", err)
			}
		}()
		log.Info("serving the snapshot provider (EXPERIMENTAL, KEP-0694)", "addr", l.Addr().String())
		return func(sctx context.Context) {
			stopped := make(chan struct{})
			go func() { g.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-sctx.Done():
				g.Stop()
			}
			<-done
		}, nil
	}
}
