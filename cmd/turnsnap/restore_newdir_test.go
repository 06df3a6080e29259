package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Directories the sandbox made itself (overlay marks each one opaque in
// its layer) restore like any other, in place and with --to, on overlay
// and on btrfs: a new directory below a base one, a new top-level one,
// the base directory holding them, and a base directory renamed in the
// sandbox (issue 24: these failed as "corrupt data", exit 7).
func TestCLIRestoreNewDirectories(t *testing.T) {
	for _, backend := range []string{"overlay", "btrfs"} {
		t.Run(backend, func(t *testing.T) {
			testenv.RequireRoot(t)
			home := filepath.Join(t.TempDir(), "home")
			base := t.TempDir()
			write(t, filepath.Join(base, "src", "old.txt"), "old\n", 0o644)
			write(t, filepath.Join(base, "lib", "l.txt"), "lib\n", 0o644)
			args := []string{"sandbox", "create", "s", "--base", base}
			if backend == "btrfs" {
				args = append(args, "--backend", "btrfs", "--btrfs-pool", btrfstest.Pool(t))
			}
			t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
			var created struct{ Root string }
			runJSON(t, home, &created, args...)
			live := func(p string) string { return filepath.Join(created.Root, p) }

			// Turn 1: new directories, and lib renamed to lib2 (mv: a
			// rename on btrfs, a copy or a redirect on overlay).
			write(t, live("src/nd/a.txt"), "1\n", 0o644)
			if err := os.MkdirAll(live("src/nd/inner"), 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, live("topnew/c.txt"), "1\n", 0o644)
			if out, err := exec.Command("mv", live("lib"), live("lib2")).CombinedOutput(); err != nil {
				t.Fatalf("mv lib lib2: %v: %s", err, out)
			}
			write(t, live("lib2/new.txt"), "new in lib2\n", 0o644)
			c1 := checkpoint(t, home)
			want := map[string]string{"src/nd/a.txt": "1\n", "topnew/c.txt": "1\n", "src/old.txt": "old\n",
				"lib2/l.txt": "lib\n", "lib2/new.txt": "new in lib2\n"}

			// Turn 2: damage below each of them.
			damage := func() {
				t.Helper()
				write(t, live("src/nd/a.txt"), "2\n", 0o644)
				write(t, live("src/nd/extra.txt"), "extra\n", 0o644)
				os.Remove(live("src/nd/inner"))
				os.RemoveAll(live("topnew")) // made anew by the restore
				write(t, live("src/old.txt"), "old2\n", 0o644)
				write(t, live("lib2/l.txt"), "lib changed\n", 0o644)
				os.Remove(live("lib2/new.txt"))
			}
			damage()
			checkpoint(t, home)
			check := func(root, what string, paths ...string) {
				t.Helper()
				for p, w := range want {
					if !underAny(p, paths) {
						continue
					}
					if got, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(got) != w {
						t.Errorf("%s: %s is %q (%v), want %q", what, p, got, err, w)
					}
				}
				if underAny("src/nd", paths) {
					if st, err := os.Stat(filepath.Join(root, "src/nd/inner")); err != nil || !st.IsDir() {
						t.Errorf("%s: src/nd/inner not restored: %v", what, err)
					}
					if _, err := os.Lstat(filepath.Join(root, "src/nd/extra.txt")); !os.IsNotExist(err) {
						t.Errorf("%s: src/nd/extra.txt, not in the checkpoint, is still there: %v", what, err)
					}
				}
			}
			for _, paths := range [][]string{{"/src/nd"}, {"/topnew"}, {"/lib2"}, {"/src"}} {
				out, code := run(t, home, "restore", "s", c1.ID, paths[0])
				if code != 0 {
					t.Fatalf("restore %s: exit %d: %s", paths[0], code, out)
				}
				check(created.Root, "restore "+paths[0], strings.TrimPrefix(paths[0], "/"))
				damage()
			}
			// All at once, into a host directory: the sandbox stays damaged.
			to := filepath.Join(t.TempDir(), "out")
			if out, code := run(t, home, "restore", "s", c1.ID, "/src", "/topnew", "/lib2", "--to", to); code != 0 {
				t.Fatalf("restore --to: exit %d: %s", code, out)
			}
			check(to, "restore --to", "src", "topnew", "lib2")
			if got := readFile(t, live("src/nd/a.txt")); got != "2\n" {
				t.Errorf("restore --to changed the sandbox: src/nd/a.txt %q", got)
			}
			// In place, everything; the next checkpoint then equals c1.
			if out, code := run(t, home, "restore", "s", c1.ID, "/src", "/topnew", "/lib2"); code != 0 {
				t.Fatalf("restore all: exit %d: %s", code, out)
			}
			c3 := checkpoint(t, home)
			var d diffOut
			runJSON(t, home, &d, "diff", "s", c1.ID, c3.ID)
			if len(d.Changes) != 0 {
				t.Errorf("diff c1 and the checkpoint after restoring every changed path: %v", d.paths())
			}
			if out, code := run(t, home, "verify", c3.ID); code != 0 {
				t.Errorf("verify after restore: exit %d: %s", code, out)
			}
		})
	}
}

func underAny(p string, tops []string) bool {
	for _, t := range tops {
		if p == t || strings.HasPrefix(p, t+"/") {
			return true
		}
	}
	return false
}
