package harness

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/turnsnap/turnsnap/api"
)

// minio is the bench's remote store: a real MinIO on 127.0.0.1 that the
// daemon's background pusher uploads to while the traces replay, as a
// platform's would. MinIO is AGPL and runs as a separate process.
type minio struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	endpoint string
	access   string
	secret   string
	logPath  string
	stopped  bool
}

// startMinIO starts bin serving dir on a free loopback port.
func startMinIO(ctx context.Context, bin, dir string) (*minio, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	endpoint := l.Addr().String()
	l.Close()
	m := &minio{endpoint: endpoint, access: "bench" + randHex(8), secret: randHex(20),
		logPath: filepath.Join(dir, "minio.log"), exited: make(chan struct{})}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	m.cmd = exec.Command(bin, "server", filepath.Join(dir, "data"), "--address", endpoint,
		"--console-address", "127.0.0.1:0", "--certs-dir", filepath.Join(dir, "certs"))
	m.cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+m.access, "MINIO_ROOT_PASSWORD="+m.secret,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "HOME="+dir)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start MinIO %s: %w", bin, err)
	}
	go func() { m.cmd.Wait(); close(m.exited) }()
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		// The cluster health check answers 200 once the object layer is up.
		if resp, err := hc.Get("http://" + endpoint + "/minio/health/cluster"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return m, nil
			}
		}
		select {
		case <-m.exited:
			return nil, fmt.Errorf("MinIO exited at start (see %s)", m.logPath)
		case <-ctx.Done():
			m.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.stop()
			return nil, fmt.Errorf("MinIO on %s does not answer (see %s)", endpoint, m.logPath)
		}
	}
}

func (m *minio) stop() {
	if m == nil || m.stopped {
		return
	}
	m.stopped = true
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Kill()
		<-m.exited
	}
}

// env is what the daemon needs to reach the bucket.
func (m *minio) env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + m.access, "AWS_SECRET_ACCESS_KEY=" + m.secret}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// initRemote points the daemon's home at the bucket; the daemon's pusher
// starts uploading at once.
func (h *Harness) initRemote(ctx context.Context) error {
	_, err := h.c.Init(ctx, api.InitRequest{Remote: &api.RemoteConfig{
		URL: "s3://turnsnap-bench/home", Endpoint: h.minio.endpoint, Insecure: true}})
	if err != nil {
		return fmt.Errorf("turnsnap init --remote (MinIO on %s): %w", h.minio.endpoint, err)
	}
	return nil
}

// uploadMetric is the daemon's counter of bytes its successful PUTs sent.
const uploadMetric = "turnsnap_upload_bytes_total"

// daemonUploaded reads the running daemon's upload counter (it starts at 0
// with every daemon).
func (h *Harness) daemonUploaded(ctx context.Context) (int64, error) {
	text, err := h.c.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == uploadMetric {
			v, err := strconv.ParseFloat(f[1], 64)
			return int64(v), err
		}
	}
	return 0, nil // no upload yet
}

// uploaded is every byte uploaded since the bench began: the counters of
// the daemons the crashes killed plus the running one's. Nil remote: 0.
func (h *Harness) uploaded(ctx context.Context) int64 {
	if h.minio == nil {
		return 0
	}
	n, err := h.daemonUploaded(ctx)
	if err != nil {
		h.cfg.Log.Warn("reading the upload counter", "err", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.uploadBase + n
}

// drain waits for the background pusher to empty the upload queue (a
// sync through the daemon joins its push), so that a run's uploads are
// counted before the next run starts.
func (h *Harness) drain(ctx context.Context) {
	if h.minio == nil {
		return
	}
	if _, err := h.c.Sync(ctx, api.SyncRequest{}); err != nil {
		h.cfg.Log.Warn("sync to the bench's MinIO", "err", err)
	}
}
