package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/internal/testhook"
	"golang.org/x/sys/unix"
)

// openPty opens a pseudo-terminal pair and leaves its window size unset
// (0x0), as a serial console or a bare container pty reports it.
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		testenv.Missing(t, "a pty", "/dev/ptmx")
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// Progress shows the phase, the total and a percentage, also on a terminal
// that reports no window size.
func TestCLIProgressOnSizelessPty(t *testing.T) {
	testenv.RequireRoot(t)
	master, slave := openPty(t)
	if ws, err := unix.IoctlGetWinsize(int(slave.Fd()), unix.TIOCGWINSZ); err != nil || ws.Col != 0 || ws.Row != 0 {
		t.Fatalf("the pty reports a window size: %+v %v", ws, err)
	}
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var s struct{ Root string }
	runJSON(t, home, &s, "sandbox", "create", "s", "--base", base)
	big := make([]byte, 3<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(s.Root, "big"), big, 0o644)
	var c1 struct{ ID string }
	runJSON(t, home, &c1, "checkpoint", "s")
	os.Remove(filepath.Join(s.Root, "big"))
	runJSON(t, home, &struct{}{}, "checkpoint", "s")

	// The rollback stops for good once its root is switched; by then the
	// restore phase has read its 3 MiB, and the spinner must be on screen.
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := cli(home, []string{testhook.BlockAtEnv + "=rollback: root switched:" + ready}, "rollback", "s", c1.ID)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var screen bytes.Buffer
	got := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			screen.Write(buf[:n])
			if strings.Contains(screen.String(), "%)") || err != nil {
				close(got)
				return
			}
		}
	}()
	select {
	case <-got:
	case <-time.After(20 * time.Second):
		t.Fatalf("no progress on a sizeless pty in 20s; screen %q", screen.String())
	}
	cmd.Process.Kill()
	cmd.Wait()
	text := screen.String()
	if !strings.Contains(text, "restore: ") || !strings.Contains(text, "of 3.0 MiB (") {
		t.Fatalf("progress line without phase or total: %q", text)
	}
	// The killed rollback is finished by the next command (engine/intent).
	var ck struct{ ID, Class string }
	runJSON(t, home, &ck, "checkpoint", "s")
	if ck.ID != c1.ID || ck.Class != "skip" {
		t.Fatalf("checkpoint after the interrupted rollback: %+v, want a skip at %s", ck, c1.ID)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "big")); err != nil {
		t.Fatalf("the interrupted rollback was not finished: %v", err)
	}
}

func TestProgressLine(t *testing.T) {
	for _, tc := range []struct {
		p    engine.Progress
		want string
	}{
		{engine.Progress{Blobs: 3, Bytes: 1 << 20, Elapsed: time.Second}, "working: 3 chunks, 1.0 MiB (1.0 MiB/s) "},
		{engine.Progress{Blobs: 3, Bytes: 1 << 20, Elapsed: time.Second, Phase: "upload", Total: 4 << 20, Done: 1 << 20}, "upload: 3 chunks, 1.0 MiB of 4.0 MiB (25%) (1.0 MiB/s) "},
		{engine.Progress{Blobs: 9, Bytes: 5 << 20, Elapsed: time.Second, Phase: "restore", Total: 4 << 20, Done: 5 << 20}, "restore: 9 chunks, 4.0 MiB of 4.0 MiB (99%) (5.0 MiB/s) "},
	} {
		if got := progressLine(tc.p); got != tc.want {
			t.Errorf("progressLine(%+v) = %q, want %q", tc.p, got, tc.want)
		}
	}
}
