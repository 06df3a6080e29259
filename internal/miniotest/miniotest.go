// Package miniotest runs a real MinIO server for tests: on 127.0.0.1 (or
// another address of this host the test made, StartAt), on a free port,
// with random credentials and a data directory of its own, and lets a test
// kill it and start it again on the same data, as a crash would.
//
// MinIO is AGPL: it runs as a separate process, never linked. The binary is
// built by scripts/deps.d/40-minio.sh into $TURNSNAP_CACHE/bin/minio; when it
// is absent, Start reports the part missing through testenv.
package miniotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// defaultCache is where scripts/deps.sh puts tools when TURNSNAP_CACHE is unset.
const defaultCache = "/var/cache/turnsnap"

// startTimeout bounds the wait for a fresh server to answer its health
// check; it comes up in well under a second here, and a restart after
// SIGKILL in a few.
const startTimeout = 30 * time.Second

// Server is one MinIO server process and the data directory it serves.
type Server struct {
	// Endpoint is HOST:PORT, for S3Config.Endpoint (plain HTTP).
	Endpoint string
	// AccessKey and SecretKey are the root credentials, random per server.
	AccessKey, SecretKey string
	// Dir holds the server's data; it survives Kill and Restart.
	Dir string

	bin     string
	logPath string
	host    string // the address it listens on (S3 and console)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Binary returns the path of the MinIO binary the deps script builds, and
// whether it is there.
func Binary() (string, bool) {
	cache := os.Getenv("TURNSNAP_CACHE")
	if cache == "" {
		cache = defaultCache
	}
	bin := filepath.Join(cache, "bin", "minio")
	info, err := os.Stat(bin)
	return bin, err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}

// Start starts a server for t and stops it when t ends. If the binary is
// missing, t is skipped (or failed under `make test`) via testenv.Missing.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartAt(t, "127.0.0.1")
}

// StartAt is Start listening on host, an address of this host other than
// loopback: the fleet test gives it the root namespace's end of a bridge so
// that daemons in other network namespaces reach it.
func StartAt(t testing.TB, host string) *Server {
	t.Helper()
	bin, ok := Binary()
	if !ok {
		testenv.Missing(t, "MinIO server", bin+" is not built; scripts/deps.d/40-minio.sh builds it")
	}
	dir := t.TempDir()
	s := &Server{
		AccessKey: "ts" + randomHex(9),
		SecretKey: randomHex(20),
		Dir:       filepath.Join(dir, "data"),
		bin:       bin,
		logPath:   filepath.Join(dir, "minio.log"),
		host:      host,
	}
	t.Cleanup(s.Kill)
	var err error
	for range 3 { // a port picked free may be taken before MinIO binds it
		var port int
		if port, err = testenv.FreePort(host); err != nil {
			break
		}
		s.Endpoint = net.JoinHostPort(host, strconv.Itoa(port))
		if err = s.start(); err == nil {
			return s
		}
	}
	t.Fatalf("starting MinIO: %v\n%s", err, s.logTail())
	return nil
}

// Kill stops the server with SIGKILL, as a crash or a lost host would, and
// waits for it to exit. The data directory stays. Killing a stopped server
// does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts the server again on the same data directory, port and
// credentials, after Kill (it kills a running server first). It returns an
// error rather than failing a test, so a test may call it from another
// goroutine while an upload is under way.
func (s *Server) Restart() error {
	s.Kill()
	deadline := time.Now().Add(startTimeout)
	for {
		err := s.start()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("restarting MinIO on %s: %w\n%s", s.Endpoint, err, s.logTail())
		}
		time.Sleep(100 * time.Millisecond) // the old socket may linger briefly
	}
}

// Running reports whether the server process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

func (s *Server) start() error {
	console, err := testenv.FreePort(s.host)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "server", s.Dir,
		"--address", s.Endpoint,
		"--console-address", net.JoinHostPort(s.host, strconv.Itoa(console)),
		"--certs-dir", filepath.Join(filepath.Dir(s.Dir), "certs"))
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"HOME="+filepath.Dir(s.Dir),
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies, the server must not outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	err = waitHealthy(s.Endpoint, done)
	if err == nil {
		err = s.ours()
	}
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// waitHealthy polls until the server can serve S3 requests, the process
// exits, or startTimeout passes. The liveness check answers before the
// object layer is up (requests then get 503 XMinioServerNotInitialized), so
// it waits for the cluster health check and for an anonymous S3 request
// to be refused (403) rather than put off (503).
func waitHealthy(endpoint string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	status := func(path string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if status("/minio/health/cluster") == http.StatusOK && status("/") == http.StatusForbidden {
			return nil
		}
		select {
		case <-exited:
			return errors.New("the server exited during startup")
		case <-ctx.Done():
			return fmt.Errorf("no healthy answer within %s", startTimeout)
		case <-tick.C:
		}
	}
}

// ours checks that the server answering on the endpoint is this one: a port
// picked free can be bound by another test's MinIO before this one binds it
// (package tests run in parallel), and that server is healthy too, but it
// does not know these credentials.
func (s *Server) ours() error {
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, "")})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.ListBuckets(ctx); err != nil {
		return fmt.Errorf("the server on %s is not this test's (%w)", s.Endpoint, err)
	}
	return nil
}

// logTail returns the end of the server's log, for failure messages.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
