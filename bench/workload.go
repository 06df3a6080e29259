// Package bench holds turnsnap's benchmark workloads: generators that build
// sandboxes of a given shape (a source project, text that compresses like
// code), for the benchmark harness and the demo.
package bench

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
)

// WriteProject writes a small source project, the demo's base image: source
// files, tests, docs, a data file the agent deletes, a binary asset and an
// empty tmp/ directory.
func WriteProject(dir string, seed int64) error {
	rng := rand.New(rand.NewSource(seed))
	files := map[string]string{
		"README.md":          "# sample service\n\nA small project an agent works on.\n",
		"src/main.go":        "package main\n\nfunc main() {}\n",
		"src/util.go":        "package main\n\nfunc clamp(x, lo, hi int) int { return min(max(x, lo), hi) }\n",
		"data/config.json":   `{"port": 8080, "debug": false}` + "\n",
		"docs/design.md":     "# design\n",
		"tests/main_test.go": "package main\n",
	}
	for i := range 20 {
		files[fmt.Sprintf("src/pkg%02d/code.go", i)] = string(TextLike(rng, 4096))
	}
	for rel, content := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	asset := make([]byte, 512<<10)
	rng.Read(asset)
	if err := os.MkdirAll(filepath.Join(dir, "assets"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "assets/logo.bin"), asset, 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	return addBusybox(dir)
}

// addBusybox makes the project runnable in a container when this host has
// busybox-static: /bin/busybox with its applets, and a web root for the
// demo's dev server. Without it the demo runs its file turns only.
func addBusybox(dir string) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil
	}
	for _, d := range []string{"bin", "proc", "dev", "sys", "root", "www"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bb, 0o755); err != nil {
		return err
	}
	for _, applet := range []string{"sh", "sleep", "httpd", "wget", "ls", "cat", "mv", "echo", "killall"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "www/index.html"), []byte("dev server: all tests green\n"), 0o644)
}

// TextLike returns n bytes that compress roughly like source code.
func TextLike(rng *rand.Rand, n int) []byte {
	words := []string{"func", "return", "if", "err", "nil", "for", "range", "ctx", "string", "int", ":=", "{", "}", "(", ")", "\n", "\t"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[rng.Intn(len(words))])
		b.WriteByte(' ')
		if rng.Intn(12) == 0 {
			fmt.Fprintf(&b, "v%d ", rng.Intn(100000))
		}
	}
	return []byte(b.String()[:n])
}
