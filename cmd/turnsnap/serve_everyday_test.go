package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// everydayScenario is the part of scenario for the everyday commands
// (issue 16): diff's forms, cat, ls, restore, log --all, ps, policies and
// forget. Sandbox s has checkpoints c1 (tagged t1) and c3, and branches.
func everydayScenario(do func(args ...string) string, c1, c3 string) {
	do("diff", "s", c1[:8], c3[:8], "--stat")
	do("diff", "s", c1[:8], c3[:8], "-p")
	do("diff", "s", c1[:8], c3[:8], "-p", "--json")
	do("diff", "s", c1[:8], c3[:8], "-z")
	do("diff", "s", "-z", "--json") // refused: exit 2 both ways
	do("diff", "s", "", c3[:8])     // a 'to' without a 'from'
	do("cat", c3[:8], "/f2")
	do("cat", c1, "/f1")
	do("cat", c3, "/nosuch")
	do("cat", c3, "/src")
	do("cat", "t1", "/src/main.go")
	do("ls", c3)
	do("ls", c3, "--json")
	do("ls", "t1", "/src", "--json")
	do("ls", c3, "/nosuch")
	do("cat", "s@HEAD~1", "/f2") // issue 24: HEAD forms, served as direct
	do("ls", "s@HEAD~1", "--json")
	do("diff", "s", "HEAD~1", "HEAD", "--json")
	do("cat", "HEAD", "/f2", "--json")            // no sandbox in context: exit 2
	do("restore", "s", "HEAD~9", "/f2", "--json") // past the first checkpoint: exit 3
	do("restore", "s", "t1", "/f1", "--json")
	do("restore", "s", "t1", "/f1", "/f2")
	do("restore", "s", "t1", "/nosuch")
	do("restore", "s", "ffffffffffff", "/f1")
	do("log", "--all")
	do("log", "--all", "--json")
	do("log", "--all", "--graph")
	do("ps", "s")
	do("ps", "s", "--json")
	do("ps", "nosuch")
	do("policy", "show")
	do("policy", "set", "s", "--keep-last", "2", "--json")
	do("policy", "set", "--keep-daily", "3")
	do("policy", "show", "--json")
	do("policy", "show", "s")
	do("policy", "set", "s", "--keep-within", "forever")
	do("policy", "apply", "--json")
	do("policy", "clear", "s", "--json")
	do("policy", "clear")
	do("policy", "apply")
	do("forget", "s", "--keep-last", "1", "--dry-run", "--json")
	do("forget", "s", "--keep-last", "1", "--dry-run")
	do("forget", "s")
	do("forget", "nosuch", "--keep-last", "1")
	do("forget", "--all", "--keep-last", "1", "--json")
	do("forget", "s", "--keep-last", "1", "--gc")
	do("log", "--all")
}

// damageLargestNewPack flips a byte in the last chunk of the largest pack
// checkpoint after has that before lacks (a file of several chunks).
func damageLargestNewPack(t *testing.T, home string, before, after []string) string {
	t.Helper()
	var pack string
	var size int64
	for _, o := range after {
		if fi, err := os.Stat(filepath.Join(home, "store", o)); err == nil && !slices.Contains(before, o) && fi.Size() > size {
			pack, size = o, fi.Size()
		}
	}
	if pack == "" {
		t.Fatalf("no new pack among %v", after)
	}
	obj := filepath.Join(home, "store", pack)
	data, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)*15/16] ^= 0x55 // in the last chunk, before the pack's header
	if err := os.WriteFile(obj, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return pack
}

// Through a daemon, a cat that meets a damaged chunk mid-file exits 7
// naming the object after the bytes before it, as it does directly; and
// restore --to, which would have the daemon write into a host directory a
// client names, is refused with a message saying why.
func TestServeCatCorruptAndRestoreTo(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	var created struct{ Root string }
	out, errs := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Root == "" {
		t.Fatalf("create: %q %s", out, errs)
	}
	verifyObjects := func(ref string) []string {
		var v struct{ Objects []string }
		out, _ := mustCLI(t, home, "verify", ref, "--json")
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatal(err)
		}
		return v.Objects
	}
	// big1 (checkpoint c1) stays whole, big2 (c2) gets a damaged chunk.
	// Both are written before the daemon starts, so it has cached neither.
	big1, big2 := make([]byte, 1<<20), make([]byte, 1<<20)
	rand.Read(big1)
	rand.Read(big2)
	var c1, c2 struct{ ID string }
	os.WriteFile(filepath.Join(created.Root, "big1.bin"), big1, 0o644)
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	json.Unmarshal([]byte(out), &c1)
	before := verifyObjects(c1.ID)
	os.WriteFile(filepath.Join(created.Root, "big2.bin"), big2, 0o644)
	out, _ = mustCLI(t, home, "checkpoint", "s", "--json")
	json.Unmarshal([]byte(out), &c2)
	pack := damageLargestNewPack(t, home, before, verifyObjects(c2.ID))

	d := startDaemon(t, home, nil)
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "s") })
	if out, errs, code := cliRun(t, home, "--lock-wait", "0s", "cat", c2.ID, "/big1.bin"); code != 0 || out != string(big1) {
		t.Fatalf("cat big1.bin through the daemon: exit %d, %d bytes: %s", code, len(out), errs)
	}
	out, errs, code := cliRun(t, home, "--lock-wait", "0s", "cat", c2.ID, "/big2.bin")
	if code != exitCorrupt || !strings.Contains(errs, pack) {
		t.Fatalf("cat of a damaged chunk through the daemon: exit %d, want %d naming %s: %s", code, exitCorrupt, pack, errs)
	}
	if !strings.Contains(errs, "output incomplete") || len(out) >= len(big2) || !strings.HasPrefix(string(big2), out) || len(out) < 16<<10 {
		t.Fatalf("a mid-stream failure through the daemon: %d of %d bytes, not a prefix or not said incomplete: %s", len(out), len(big2), errs)
	}
	if strings.Count(errs, pack) != 1 {
		t.Errorf("the object is named more than once: %s", errs)
	}
	// A client that does not read trailers (no "TE: trailers": curl,
	// Python's http.client) sees the body cut off, never a whole file.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", filepath.Join(home, socketName))
	}}}
	resp, err := hc.Get("http://turnsnap/v1/checkpoints/" + c2.ID + "/content?path=/big2.bin")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err == nil || len(body) >= len(big2) {
		t.Fatalf("cat without trailers of a damaged file: HTTP %d, %d of %d bytes, read error %v", resp.StatusCode, len(body), len(big2), err)
	}
	// The daemon survived and says what happened.
	if out, _, code := cliRun(t, home, "cat", c2.ID, "/a"); code != 0 || out != "a\n" {
		t.Fatalf("cat after the damaged one: exit %d: %q", code, out)
	}
	if !strings.Contains(d.stderr.String(), "cat cut off mid-file") {
		t.Errorf("the daemon did not log the cut-off cat:\n%s", d.stderr.String())
	}

	to := filepath.Join(dir, "out")
	out, errs, code = cliRun(t, home, "restore", "s", c1.ID, "/a", "--to", to)
	if code != exitUsage || !strings.Contains(errs, "--to") || !strings.Contains(errs, "daemon") {
		t.Fatalf("restore --to through the daemon: exit %d, want %d with a message naming --to and the daemon: %s %s", code, exitUsage, out, errs)
	}
	if _, err := os.Stat(to); !os.IsNotExist(err) {
		t.Fatalf("the refused restore --to made %s: %v", to, err)
	}
	out, errs, code = cliRun(t, home, "restore", "s", c1.ID, "/a", "--to", to, "--json")
	var e struct{ Error struct{ Class string } }
	if code != exitUsage || json.Unmarshal([]byte(out), &e) != nil || e.Error.Class != "invalid" {
		t.Fatalf("restore --to --json through the daemon: exit %d: %s %s", code, out, errs)
	}
	// Into the sandbox it works.
	os.WriteFile(filepath.Join(created.Root, "a"), []byte("changed\n"), 0o644)
	if out, errs, code := cliRun(t, home, "restore", "s", c1.ID, "/a"); code != 0 || !strings.Contains(out, "restored /a") {
		t.Fatalf("restore through the daemon: exit %d: %s %s", code, out, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(created.Root, "a")); string(b) != "a\n" {
		t.Fatalf("restored /a holds %q", b)
	}
}

var forgottenMetric = regexp.MustCompile(`(?m)^turnsnap_forgotten_checkpoints_total (\S+)$`)

// serve --forget-interval applies the stored policies on its schedule:
// the checkpoints the policy does not keep go, the daemon logs them and
// counts them in turnsnap_forgotten_checkpoints_total.
func TestServeForgetInterval(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "s", "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)
	for i := range 4 {
		os.WriteFile(filepath.Join(created.Root, "f"), []byte(strconv.Itoa(i)), 0o644)
		mustCLI(t, home, "checkpoint", "s")
	}
	logLen := func() int {
		var entries []json.RawMessage
		out, _ := mustCLI(t, home, "log", "s", "--json")
		if err := json.Unmarshal([]byte(out), &entries); err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	n := logLen()
	if n < 5 {
		t.Fatalf("%d checkpoints, want 5", n)
	}
	mustCLI(t, home, "policy", "set", "s", "--keep-last", "2")

	d := startDaemon(t, home, nil, "--forget-interval", "100ms")
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "s") })
	c := d.client(t)
	ctx := context.Background()
	var forgotten float64
	deadline := time.Now().Add(30 * time.Second)
	for forgotten == 0 {
		m, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v := forgottenMetric.FindStringSubmatch(m); v != nil {
			forgotten, _ = strconv.ParseFloat(v[1], 64)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no scheduled forget within 30s:\n%s", d.stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition, not timing it
	}
	if forgotten != float64(n-2) {
		t.Errorf("turnsnap_forgotten_checkpoints_total %v, want %d", forgotten, n-2)
	}
	if got := logLen(); got != 2 {
		t.Errorf("after the scheduled forget: %d checkpoints, want 2", got)
	}
	if l := d.stderr.String(); !strings.Contains(l, "scheduled forget deleted checkpoints") || !strings.Contains(l, "sandbox=s") {
		t.Errorf("the daemon did not log what it forgot:\n%s", l)
	}
	if code := d.stop(t); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, d.stderr.String())
	}
}
