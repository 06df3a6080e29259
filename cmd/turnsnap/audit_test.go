package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// audit on a real sandbox: a file turn, a process turn, an edit with a
// mode change, a delete. --json says what changed, with sizes and
// metadata, the process image's state and what weaker recovery loses;
// --html renders every turn in headless chromium.
func TestAudit(t *testing.T) {
	testenv.RequireRoot(t)
	base := busyboxBase(t, "chmod", "rm")
	os.WriteFile(filepath.Join(base, "notes.txt"), []byte("v1\n"), 0o644)
	home := filepath.Join(t.TempDir(), "home")
	mustCLI(t, home, "sandbox", "create", "a", "--base", base)
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "a") })
	mustCLI(t, home, "exec", "a", "--", "sh", "-c", "echo hello > /new.txt")
	mustCLI(t, home, "checkpoint", "a", "-m", "add a file")
	mustCLI(t, home, "exec", "a", "--detach", "--", "sh", "-c", "exec sleep 100000")
	mustCLI(t, home, "checkpoint", "a", "-m", "start a process")
	mustCLI(t, home, "exec", "a", "--", "sh", "-c", "echo v2 >> /notes.txt; chmod 600 /notes.txt; rm /new.txt")
	mustCLI(t, home, "checkpoint", "a", "-m", "edit and delete")
	mustCLI(t, home, "checkpoint", "a", "-m", "nothing")

	out, _ := mustCLI(t, home, "audit", "a", "--json")
	var rep struct {
		Turns []struct {
			Turn                     int
			Class, Message           string
			Added, Modified, Deleted int
			Files                    []struct {
				Path, Change    string
				Size, Prev_size uint64
				Meta            []string
				Content         bool
			}
			Processes     struct{ State, Why string }
			ChatOnlyLoses struct {
				Paths     int
				Processes bool
			} `json:"chat_only_loses"`
			ChatFSLoses struct{ Processes bool } `json:"chat_fs_loses"`
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, out)
	}
	if len(rep.Turns) != 4 { // the create (turn 0) and three turns; the skip is no checkpoint of its own
		t.Fatalf("audit lists %d turns, want 4:\n%s", len(rep.Turns), out)
	}
	added, proc, edit := rep.Turns[1], rep.Turns[2], rep.Turns[3]
	if added.Added != 1 || len(added.Files) != 1 || added.Files[0].Path != "/new.txt" || added.Files[0].Size != 6 {
		t.Errorf("turn 1 (add /new.txt): %+v", added)
	}
	if proc.Processes.State != "started" || !proc.ChatFSLoses.Processes || !proc.ChatOnlyLoses.Processes {
		t.Errorf("turn 2 (start a process): %+v", proc)
	}
	// Why the processes changed comes from the record (version 4), and a
	// turn whose processes did not change gives no reason.
	if !strings.Contains(proc.Processes.Why, "not yet in any checkpoint") || edit.Processes.Why != "" {
		t.Errorf("why: turn 2 %q, turn 3 %q", proc.Processes.Why, edit.Processes.Why)
	}
	if edit.Modified != 1 || edit.Deleted != 1 || edit.ChatOnlyLoses.Paths != 1 || edit.Processes.State != "unchanged" {
		t.Errorf("turn 3 (edit and delete): %+v", edit)
	}
	for _, f := range edit.Files {
		if f.Path == "/notes.txt" && (!f.Content || f.Size != 6 || f.Prev_size != 3 || !strings.Contains(strings.Join(f.Meta, ","), "mode 0644 -> 0600")) {
			t.Errorf("/notes.txt change: %+v", f)
		}
	}

	// Through a daemon serving the home: the same report.
	d := startDaemon(t, home, nil)
	if viaDaemon, _ := mustCLI(t, home, "audit", "a", "--json"); viaDaemon != out {
		t.Errorf("audit through the daemon differs from direct:\n%s\n%s", viaDaemon, out)
	}
	html, _ := mustCLI(t, home, "audit", "a", "--html")
	d.stop(t)
	if strings.Contains(html, "http://") || strings.Contains(html, "https://") || strings.Contains(html, " src=") {
		t.Error("the audit page refers to something outside itself")
	}
	dom := chromiumDOM(t, html)
	for _, tr := range rep.Turns {
		if !strings.Contains(dom, fmt.Sprintf(`id="turn-%d"`, tr.Turn)) {
			t.Errorf("chromium's DOM has no turn %d", tr.Turn)
		}
	}
	if !strings.Contains(dom, fmt.Sprintf(`data-rendered="%d"`, len(rep.Turns))) || !strings.Contains(dom, "chat+fs recovery would lose: the running processes") {
		t.Errorf("the page's script did not render every turn:\n%.2000s", dom)
	}
	if !strings.Contains(dom, "why: "+proc.Processes.Why) {
		t.Errorf("the page does not say why turn 2's processes changed (%q)", proc.Processes.Why)
	}
}

// chromiumDOM loads html in headless chromium and returns the DOM after
// its scripts ran.
func chromiumDOM(t *testing.T, html string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Missing(t, "chromium", "apt package chromium (scripts/deps.d/70-chromium.sh)")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "audit.html")
	os.WriteFile(page, []byte(html), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+filepath.Join(dir, "profile"),
		"--dump-dom", "file://"+page)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return string(dom)
}
