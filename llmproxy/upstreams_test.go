package llmproxy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// The upstreams table: credentials refused and never echoed, URLs redacted
// for logs, an oversized or malformed file refused as corruption, a write
// leaving no temp file behind.
func TestUpstreams(t *testing.T) {
	home := t.TempDir()
	u := NewUpstreams(home)
	for _, bad := range []string{"http://user:hunter2@gw.example", "ftp://gw.example", "http://", "http://gw.example/?key=hunter2", "::"} {
		err := u.Set("s", bad)
		if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("Set(%q): %v", bad, err)
		}
	}
	if err := u.Set("../x", "http://gw.example"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad sandbox name: %v", err)
	}
	if err := u.Set("s", "https://gw.example/openai"); err != nil {
		t.Fatal(err)
	}
	if got, _ := u.Get("s"); got != "https://gw.example/openai" {
		t.Fatalf("Get: %q", got)
	}
	if err := u.Set("s", ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := u.Get("s"); got != "" {
		t.Fatalf("cleared: %q", got)
	}
	// A replay setting of off is kept beside the upstreams; auto clears it,
	// and a table without one is written as before.
	if err := u.SetReplay("s", ReplayOff); err != nil {
		t.Fatal(err)
	}
	if r, _ := u.Replay("s"); r != ReplayOff {
		t.Fatalf("Replay after off: %q", r)
	}
	if r, _ := u.Replay("t"); r != ReplayAuto {
		t.Fatalf("Replay of an unset sandbox: %q", r)
	}
	if err := u.SetReplay("s", ReplayAuto); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(home, UpstreamsFile)); strings.Contains(string(data), "replay") {
		t.Fatalf("a table with no replay setting holds %s", data)
	}
	ents, _ := os.ReadDir(home)
	if len(ents) != 1 || ents[0].Name() != UpstreamsFile {
		t.Fatalf("home holds %v after writes", ents)
	}
	if r := RedactURL("https://a:b@gw.example/p?k=v"); strings.Contains(r, "b@") || strings.Contains(r, "k=v") {
		t.Fatalf("redacted %q", r)
	}
	path := filepath.Join(home, UpstreamsFile)
	for name, data := range map[string]string{
		"oversized":   `{"version":1,"upstreams":{"s":"http://gw.example"}}` + strings.Repeat(" ", maxUpstreamsFile),
		"version":     `{"version":2,"upstreams":{}}`,
		"credentials": `{"version":1,"upstreams":{"s":"http://u:p@gw.example"}}`,
		"name":        `{"version":1,"upstreams":{"../s":"http://gw.example"}}`,
		"unknown":     `{"version":1,"upstreams":{},"extra":1}`,
		"replay":      `{"version":1,"upstreams":{},"replay":{"s":"always"}}`,
	} {
		os.WriteFile(path, []byte(data), 0o600)
		if _, err := u.Get("s"); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("%s file: %v", name, err)
		}
	}
}
