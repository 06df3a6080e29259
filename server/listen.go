package server

// The daemon's listeners: the home's unix socket, TCP with a bearer
// token (and TLS off loopback), and their shutdown.

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// CheckListen applies the TCP rules before anything is opened.
func (f Config) CheckListen() error {
	if f.Listen == "" {
		if f.TokenFile != "" || f.TLSCert != "" || f.TLSKey != "" {
			return fmt.Errorf("serve: --token-file and --tls-* are for --listen: %w", errdefs.ErrInvalid)
		}
		return nil
	}
	host, _, err := net.SplitHostPort(f.Listen)
	if err != nil {
		return fmt.Errorf("serve: --listen %q: %v: %w", f.Listen, err, errdefs.ErrInvalid)
	}
	if f.TokenFile == "" {
		return fmt.Errorf("serve: --listen needs --token-file (every TCP request must carry its bearer token): %w", errdefs.ErrInvalid)
	}
	if (f.TLSCert == "") != (f.TLSKey == "") {
		return fmt.Errorf("serve: --tls-cert and --tls-key go together: %w", errdefs.ErrInvalid)
	}
	if f.TLSCert == "" && !loopback(host) {
		return fmt.Errorf("serve: refusing --listen %s without TLS: the bearer token would cross the network in clear (give --tls-cert and --tls-key, or listen on 127.0.0.1 or [::1]): %w", f.Listen, errdefs.ErrInvalid)
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func ReadToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("serve: token file: %v: %w", err, errdefs.ErrInvalid)
	}
	tok := []byte(strings.TrimSpace(string(b)))
	if len(tok) < 16 {
		return nil, fmt.Errorf("serve: token file %s: a token needs at least 16 characters: %w", path, errdefs.ErrInvalid)
	}
	return tok, nil
}

// RequireToken lets a request through only with the bearer token, compared
// in constant time.
func RequireToken(h http.Handler, token []byte) http.Handler {
	want := append([]byte("Bearer "), token...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="turnsnap"`)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"type":%q,"title":"unauthorized","status":401,"detail":"missing or wrong bearer token","class":"precondition"}`+"\n",
				api.ProblemType+"unauthorized")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// NewLogger is the daemon's logger on stderr: format is text or json
// (serve --log-format), debug lines too when verbose.
func NewLogger(format string, verbose bool) (*slog.Logger, error) {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	o := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("serve: --log-format %q: want text or json: %w", format, errdefs.ErrInvalid)
}

// ListenSocket makes HOME/turnsnap.sock, replacing one a killed daemon
// left (this process holds the home's lock, so no daemon uses it).
func ListenSocket(home, group string) (net.Listener, string, error) {
	sock := filepath.Join(home, SocketName)
	if len(sock) >= 108 { // sizeof(sockaddr_un.sun_path) on Linux, NUL included
		return nil, "", fmt.Errorf("serve: socket path %s is too long for a unix socket (at most 107 bytes); use a shorter --home: %w", sock, errdefs.ErrInvalid)
	}
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			g, err = user.LookupGroupId(group)
		}
		if err != nil {
			return nil, "", fmt.Errorf("serve: --socket-group %q: %v: %w", group, err, errdefs.ErrInvalid)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("serve: stale socket %s: %w", sock, err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, "", fmt.Errorf("serve: %w", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
		if err := os.Chown(sock, 0, gid); err != nil {
			l.Close()
			return nil, "", fmt.Errorf("serve: socket group: %w", err)
		}
	}
	if err := os.Chmod(sock, mode); err != nil {
		l.Close()
		return nil, "", fmt.Errorf("serve: %w", err)
	}
	return l, sock, nil
}

// ShutdownServers stops the servers accepting and lets requests in flight
// (a checkpoint committing) finish until ctx ends; what still runs then is
// cut. Sandboxes and their processes keep running.
func ShutdownServers(ctx context.Context, log *slog.Logger, servers []*http.Server) {
	log.Info("stopping: finishing requests in flight")
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Shutdown(ctx); err != nil {
				log.Warn("requests still running at the shutdown timeout were cut", "err", err)
				s.Close()
			}
		}()
	}
	wg.Wait()
}
