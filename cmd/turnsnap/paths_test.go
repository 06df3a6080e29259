package main

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/btrfstest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
	"golang.org/x/sys/unix"
)

// newSandbox makes a home and a sandbox "s" on an overlay root over the
// base that fill writes, and returns the home and the live root.
func newSandbox(t *testing.T, fill func(base string)) (home, root string) {
	t.Helper()
	testenv.RequireRoot(t)
	home = filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	fill(base)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)
	return home, created.Root
}

type ckptOut struct {
	ID    string `json:"id"`
	Class string `json:"class"`
}

func checkpoint(t *testing.T, home string) ckptOut {
	t.Helper()
	var c ckptOut
	runJSON(t, home, &c, "checkpoint", "s")
	return c
}

func write(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type diffOut struct {
	Changes []struct {
		Change, Path, Type string
		PathB64            string  `json:"path_b64"`
		OldSize            *uint64 `json:"old_size"`
		NewSize            *uint64 `json:"new_size"`
		Meta               []struct{ Field, Name, Old, New string }
		Patch              string
		Binary             bool
	}
}

func (d diffOut) paths() []string {
	var out []string
	for _, c := range d.Changes {
		out = append(out, c.Change[:1]+" "+c.Path)
	}
	return out
}

// cat of any checkpoint gives the file's bytes then; ls lists a directory
// of it; a damaged chunk stops cat with exit 7 naming the pack, even after
// part of the file was written.
func TestCLICatLs(t *testing.T) {
	home, root := newSandbox(t, func(base string) {
		write(t, filepath.Join(base, "a.txt"), "base a\n", 0o644)
		write(t, filepath.Join(base, "dir", "x"), "x0\n", 0o600)
		os.Symlink("x", filepath.Join(base, "dir", "link"))
		os.Link(filepath.Join(base, "dir", "x"), filepath.Join(base, "dir", "x2"))
	})
	write(t, filepath.Join(root, "a.txt"), "turn one\n", 0o644)
	c1 := checkpoint(t, home)
	write(t, filepath.Join(root, "a.txt"), "turn two, longer\n", 0o644)
	c2 := checkpoint(t, home)
	if c1.Class != "fs" || c2.Class != "fs" {
		t.Fatalf("classes %s %s", c1.Class, c2.Class)
	}
	runJSON(t, home, &struct{}{}, "tag", "first", c1.ID)
	for _, tc := range []struct{ ref, path, want string }{
		{c1.ID, "/a.txt", "turn one\n"},
		{c1.ID[:8], "a.txt", "turn one\n"},
		{"first", "//a.txt", "turn one\n"},
		{c2.ID, "/a.txt", "turn two, longer\n"},
		{c2.ID, "/dir/x", "x0\n"},
		{c2.ID, "/dir/x2", "x0\n"}, // a hardlink reads as its primary
	} {
		out, code := run(t, home, "cat", tc.ref, tc.path)
		if code != 0 || out != tc.want {
			t.Errorf("cat %s %s: exit %d %q, want %q", tc.ref, tc.path, code, out, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"cat", c1.ID, "/dir"}, exitUsage, "is a directory"},
		{[]string{"cat", c1.ID, "/"}, exitUsage, "is a directory"},
		{[]string{"cat", c1.ID, "/dir/link"}, exitUsage, "symlink"},
		{[]string{"cat", c1.ID, "/nope"}, exitNotFound, "/nope"},
		{[]string{"cat", c1.ID, "/a.txt/more"}, exitNotFound, "a.txt/more"},
		{[]string{"cat", c1.ID, "/../etc/passwd"}, exitUsage, ".."},
		{[]string{"cat", "ffffffff", "/a.txt"}, exitNotFound, "ffffffff"},
		{[]string{"ls", c1.ID, "/nope"}, exitNotFound, "/nope"},
		{[]string{"ls", c1.ID, "dir/../.."}, exitUsage, ".."},
	} {
		out, code := run(t, home, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.says) {
			t.Errorf("turnsnap %v: exit %d, want %d saying %q: %s", tc.args, code, tc.code, tc.says, out)
		}
	}

	type lsEntry struct {
		Name, Type, Mode, Perm, Target string
		UID, GID                       uint32
		Size                           uint64
		Mtime                          time.Time
	}
	var ls []lsEntry
	runJSON(t, home, &ls, "ls", c1.ID, "/dir")
	var names []string
	for _, e := range ls {
		names = append(names, e.Name+":"+e.Type+":"+e.Perm+":"+e.Target)
	}
	if want := []string{"link:symlink:0777:x", "x:file:0600:", "x2:hardlink:0600:/dir/x"}; !slices.Equal(names, want) {
		t.Fatalf("ls --json /dir: %v, want %v", names, want)
	}
	if ls[1].Mode != "-rw-------" || ls[1].Size != 3 || ls[2].Size != 3 {
		t.Fatalf("ls entry: %+v", ls[1])
	}
	st, _ := os.Stat(filepath.Join(root, "dir", "x"))
	if !ls[1].Mtime.Equal(st.ModTime()) {
		t.Fatalf("ls mtime %v, file has %v", ls[1].Mtime, st.ModTime())
	}
	runJSON(t, home, &ls, "ls", c1.ID)
	if len(ls) != 2 || ls[0].Name != "a.txt" || ls[0].Size != 9 || ls[1].Mode != "drwxr-xr-x" {
		t.Fatalf("ls --json /: %+v", ls)
	}
	runJSON(t, home, &ls, "ls", c2.ID, "/a.txt")
	if len(ls) != 1 || ls[0].Size != uint64(len("turn two, longer\n")) {
		t.Fatalf("ls of a file: %+v", ls)
	}
	if out, code := run(t, home, "ls", c1.ID, "/dir"); code != 0 || !strings.Contains(out, "link -> x") || !strings.Contains(out, "-rw-------") {
		t.Fatalf("ls text: exit %d\n%s", code, out)
	}

	// A file of several chunks whose last chunk is damaged in the store.
	big := make([]byte, 1<<20)
	rand.Read(big)
	var before, after struct{ Objects []string }
	runJSON(t, home, &before, "verify", c2.ID)
	if err := os.WriteFile(filepath.Join(root, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	c3 := checkpoint(t, home)
	runJSON(t, home, &after, "verify", c3.ID)
	if out, code := run(t, home, "cat", c3.ID, "/big.bin"); code != 0 || out != string(big) {
		t.Fatalf("cat big.bin: exit %d, %d bytes", code, len(out))
	}
	var pack string
	var size int64
	for _, o := range after.Objects {
		if fi, err := os.Stat(filepath.Join(home, "store", o)); err == nil && !slices.Contains(before.Objects, o) && fi.Size() > size {
			pack, size = o, fi.Size()
		}
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
	out, code := run(t, home, "cat", c3.ID, "/big.bin")
	if code != exitCorrupt || !strings.Contains(out, pack) {
		t.Fatalf("cat of a damaged chunk: exit %d, want %d naming %s: %.300q", code, exitCorrupt, pack, out)
	}
	if !strings.Contains(out, "output incomplete") || !strings.HasPrefix(out, string(big[:16<<10])) {
		t.Fatalf("a mid-stream failure does not say the output is incomplete: %.200q", out[max(0, len(out)-300):])
	}
}

// meta is what a restore must bring back of one path.
type meta struct {
	Mode, UID, GID uint32
	Mtime          int64
	Content        string
	Xattr          string
}

func metaOf(t *testing.T, p string) meta {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	m := meta{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Mtime: unix.TimespecToNsec(st.Mtim)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		m.Content = readFile(t, p)
	case unix.S_IFLNK:
		m.Content, _ = os.Readlink(p)
	}
	buf := make([]byte, 256)
	if n, err := unix.Lgetxattr(p, "user.t", buf); err == nil {
		m.Xattr = string(buf[:n])
	}
	return m
}

// restore puts a file and a whole directory back as they were, metadata
// and hardlinks included, touches nothing else, and the next checkpoint is
// an ordinary fs change whose diff shows only those paths.
func TestCLIRestorePaths(t *testing.T) {
	home, root := newSandbox(t, func(base string) {
		write(t, filepath.Join(base, "a.txt"), "base a\n", 0o644)
		write(t, filepath.Join(base, "keep.txt"), "keep\n", 0o644)
		write(t, filepath.Join(base, "dir", "x"), "x0\n", 0o644)
		write(t, filepath.Join(base, "dir", "sub", "y"), "y0\n", 0o644)
		write(t, filepath.Join(base, "dir", "same"), "never touched\n", 0o644)
		os.Symlink("x", filepath.Join(base, "dir", "link"))
	})
	live := func(p string) string { return filepath.Join(root, p) }
	upper := filepath.Join(home, "sandboxes", "s", "current", "upper")
	// Turn 1: the state to come back to.
	write(t, live("a.txt"), "a1\n", 0o640)
	write(t, live("dir/x"), "x1\n", 0o600)
	write(t, live("dir/h1"), "linked\n", 0o644)
	os.Link(live("dir/h1"), live("dir/h2"))
	os.Chown(live("dir/x"), 1000, 1001)
	if err := unix.Lsetxattr(live("dir/x"), "user.t", []byte("one"), 0); err != nil {
		t.Fatal(err)
	}
	when := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)
	os.Chtimes(live("dir/x"), when, when)
	os.Chtimes(live("a.txt"), when, when)
	want := map[string]meta{}
	for _, p := range []string{"a.txt", "dir/x", "dir/sub/y", "dir/link", "dir/h1"} {
		want[p] = metaOf(t, live(p))
	}
	c1 := checkpoint(t, home)
	// Turn 2: damage.
	write(t, live("a.txt"), "a2 and more\n", 0o644)
	write(t, live("keep.txt"), "keep2\n", 0o644)
	write(t, live("dir/x"), "x2\n", 0o755)
	unix.Lremovexattr(live("dir/x"), "user.t")
	os.RemoveAll(live("dir/sub"))
	os.Remove(live("dir/link"))
	os.Symlink("/etc/passwd", live("dir/link"))
	write(t, live("dir/extra"), "extra\n", 0o644)
	os.Remove(live("dir/h2"))
	write(t, live("late.txt"), "late\n", 0o644)
	c2 := checkpoint(t, home)

	var r struct {
		Checkpoint string
		Paths      []struct {
			Path, Action     string
			Files, Unchanged int64
		}
	}
	var sameBefore unix.Stat_t
	unix.Stat(live("dir/same"), &sameBefore)
	runJSON(t, home, &r, "restore", "s", c1.ID[:8], "/a.txt", "dir/", "/late.txt", "/dir/x", "/never")
	var actions []string
	for _, p := range r.Paths {
		actions = append(actions, p.Path+":"+p.Action)
	}
	if r.Checkpoint != c1.ID || !slices.Equal(actions, []string{"/a.txt:restored", "/dir:restored", "/late.txt:removed", "/never:absent"}) {
		t.Fatalf("restore --json: %+v", r)
	}
	for p, m := range want {
		if got := metaOf(t, live(p)); got != m {
			t.Errorf("%s after restore: %+v, want %+v", p, got, m)
		}
	}
	// What was already as in c1 is left alone: same inode, not copied up.
	var sameAfter unix.Stat_t
	unix.Stat(live("dir/same"), &sameAfter)
	if sameAfter.Ino != sameBefore.Ino || r.Paths[1].Unchanged == 0 {
		t.Errorf("dir/same was rewritten (inode %d -> %d, %d unchanged)", sameBefore.Ino, sameAfter.Ino, r.Paths[1].Unchanged)
	}
	if _, err := os.Lstat(filepath.Join(upper, "dir", "same")); !os.IsNotExist(err) {
		t.Errorf("restore copied the unchanged base file dir/same up: %v", err)
	}
	var s1, s2 unix.Stat_t
	unix.Stat(live("dir/h1"), &s1)
	unix.Stat(live("dir/h2"), &s2)
	if s1.Ino != s2.Ino || s1.Nlink != 2 {
		t.Errorf("dir/h1 and dir/h2 are not one file again: inodes %d %d", s1.Ino, s2.Ino)
	}
	for _, gone := range []string{"dir/extra", "late.txt"} {
		if _, err := os.Lstat(live(gone)); !os.IsNotExist(err) {
			t.Errorf("%s still there after restore: %v", gone, err)
		}
	}
	if got := readFile(t, live("keep.txt")); got != "keep2\n" {
		t.Errorf("keep.txt, not restored, is %q", got)
	}
	ents, _ := os.ReadDir(live("dir"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".turnsnap-restore-") {
			t.Errorf("temporary name left behind: %s", e.Name())
		}
	}

	// The next checkpoint records it as an ordinary change: against c1 only
	// keep.txt differs, against c2 only the restored paths.
	c3 := checkpoint(t, home)
	if c3.Class != "fs" {
		t.Fatalf("checkpoint after restore: class %s", c3.Class)
	}
	var d diffOut
	runJSON(t, home, &d, "diff", "s", c1.ID, c3.ID)
	if got := d.paths(); !slices.Equal(got, []string{"m /keep.txt"}) {
		t.Fatalf("diff c1 c3 (restored paths equal to c1): %v", got)
	}
	runJSON(t, home, &d, "diff", "s", c2.ID, c3.ID)
	for _, p := range d.paths() {
		if !strings.HasPrefix(p[2:], "/a.txt") && !strings.HasPrefix(p[2:], "/dir/") && p[2:] != "/late.txt" {
			t.Errorf("diff c2 c3 shows %s, which was not restored", p)
		}
	}
	if len(d.Changes) < 5 {
		t.Errorf("diff c2 c3: %v", d.paths())
	}
	if c := checkpoint(t, home); c.Class != "skip" {
		t.Errorf("second checkpoint after restore: class %s", c.Class)
	}

	// A missing parent is made as it was in the checkpoint.
	subMeta := metaOf(t, live("dir/sub"))
	os.RemoveAll(live("dir/sub"))
	if out, code := run(t, home, "restore", "s", c1.ID, "/dir/sub/y"); code != 0 {
		t.Fatalf("restore below a missing parent: exit %d: %s", code, out)
	}
	if got := metaOf(t, live("dir/sub")); got != subMeta || metaOf(t, live("dir/sub/y")) != want["dir/sub/y"] {
		t.Errorf("recreated parent dir/sub: %+v, want %+v", got, subMeta)
	}

	// --to writes below a host directory and leaves the sandbox alone.
	out := filepath.Join(t.TempDir(), "out")
	write(t, live("keep.txt"), "keep3\n", 0o644)
	runJSON(t, home, &r, "restore", "s", c1.ID, "/dir/x", "/keep.txt", "--to", out)
	if got := metaOf(t, filepath.Join(out, "dir/x")); got != want["dir/x"] {
		t.Errorf("--to dir/x: %+v, want %+v", got, want["dir/x"])
	}
	if got := readFile(t, filepath.Join(out, "keep.txt")); got != "keep\n" {
		t.Errorf("--to keep.txt: %q", got)
	}
	if got := readFile(t, live("keep.txt")); got != "keep3\n" {
		t.Errorf("restore --to changed the sandbox: keep.txt %q", got)
	}
	if txt, code := run(t, home, "restore", "s", c1.ID, "/late.txt", "/a.txt"); code != 0 || !strings.Contains(txt, "restored /a.txt") || !strings.Contains(txt, "absent   /late.txt") {
		t.Errorf("restore text: exit %d\n%s", code, txt)
	}
}

// Hostile paths and a hostile live sandbox: nothing is written outside.
func TestCLIRestoreHostile(t *testing.T) {
	home, root := newSandbox(t, func(base string) {
		write(t, filepath.Join(base, "a.txt"), "base a\n", 0o644)
		write(t, filepath.Join(base, "dir", "x"), "x0\n", 0o644)
	})
	c0 := checkpoint(t, home) // a skip: the head, the base state
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	write(t, victim, "host file\n", 0o644)
	snapshot := func() string {
		var names []string
		filepath.Walk(outside, func(p string, fi os.FileInfo, err error) error {
			if err == nil {
				names = append(names, p+":"+fi.Mode().String())
			}
			return nil
		})
		sort.Strings(names)
		return strings.Join(names, "\n") + readFile(t, victim)
	}
	clean := snapshot()
	for _, args := range [][]string{
		{"restore", "s", c0.ID, "../outside"},
		{"restore", "s", c0.ID, "/../../" + strings.TrimPrefix(victim, "/")},
		{"restore", "s", c0.ID, "dir/../../x"},
		{"restore", "s", c0.ID, "/"},
		{"restore", "s", c0.ID, "./a.txt"},
		{"restore", "s", c0.ID, "a\x00b"},
	} {
		if out, code := run(t, home, args...); code != exitUsage {
			t.Errorf("turnsnap %q: exit %d, want %d: %s", args, code, exitUsage, out)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"restore", "s", "ffffffff", "/a.txt"}, exitNotFound},
		{[]string{"restore", "nosuch", c0.ID, "/a.txt"}, exitNotFound},
		{[]string{"restore", "nosuch", c0.ID, "/a.txt", "--to", t.TempDir()}, exitNotFound},
		{[]string{"restore", "s", c0.ID}, exitUsage},
	} {
		if out, code := run(t, home, tc.args...); code != tc.code {
			t.Errorf("turnsnap %q: exit %d, want %d: %s", tc.args, code, tc.code, out)
		}
	}
	// The target is a symlink out of the root: it is replaced, not followed.
	os.Remove(filepath.Join(root, "a.txt"))
	os.Symlink(victim, filepath.Join(root, "a.txt"))
	if out, code := run(t, home, "restore", "s", c0.ID, "/a.txt"); code != 0 {
		t.Fatalf("restore over a symlink: exit %d: %s", code, out)
	}
	if fi, err := os.Lstat(filepath.Join(root, "a.txt")); err != nil || !fi.Mode().IsRegular() || readFile(t, filepath.Join(root, "a.txt")) != "base a\n" {
		t.Fatalf("a.txt after restore: %v %v", fi, err)
	}
	// A parent on the way is a symlink out of the root: refused.
	os.RemoveAll(filepath.Join(root, "dir"))
	os.Symlink(outside, filepath.Join(root, "dir"))
	if out, code := run(t, home, "restore", "s", c0.ID, "/dir/x", "/dir/victim"); code != exitPrecondition || !strings.Contains(out, "symlink") {
		t.Errorf("restore below a symlinked parent: exit %d, want %d: %s", code, exitPrecondition, out)
	}
	// The same in a --to directory.
	to := t.TempDir()
	os.Symlink(outside, filepath.Join(to, "dir"))
	if out, code := run(t, home, "restore", "s", c0.ID, "/dir/x", "--to", to); code != exitPrecondition {
		t.Errorf("restore --to below a symlinked parent: exit %d: %s", code, out)
	}
	// Restoring the symlinked directory itself replaces the link.
	if out, code := run(t, home, "restore", "s", c0.ID, "/dir"); code != 0 {
		t.Fatalf("restore of a symlinked dir: exit %d: %s", code, out)
	}
	if got := readFile(t, filepath.Join(root, "dir", "x")); got != "x0\n" {
		t.Errorf("dir/x: %q", got)
	}
	if now := snapshot(); now != clean {
		t.Fatalf("something outside the root changed:\n%s\nwas\n%s", now, clean)
	}
}

// diff shows metadata, sizes (--stat), patches (-p), NUL-separated names
// (-z), and carries names that are not UTF-8 losslessly in --json.
func TestCLIDiffFormats(t *testing.T) {
	home, root := newSandbox(t, func(base string) {
		write(t, filepath.Join(base, "t.txt"), "one\ntwo\nthree\n", 0o644)
		write(t, filepath.Join(base, "bin.dat"), "\x00\x01\x02", 0o644)
		write(t, filepath.Join(base, "m.txt"), "m\n", 0o644)
		os.Symlink("a", filepath.Join(base, "l"))
	})
	live := func(p string) string { return filepath.Join(root, p) }
	write(t, live("t.txt"), "one\nTWO\nthree\n", 0o644)
	write(t, live("bin.dat"), "\x00\x01\x02\x03", 0o644)
	os.Chmod(live("m.txt"), 0o600)
	os.Chown(live("m.txt"), 7, 8)
	unix.Lsetxattr(live("m.txt"), "user.t", []byte("v"), 0)
	os.Remove(live("l"))
	os.Symlink("b", live("l"))
	bad := "bad\xffname"
	write(t, live(bad), "new\n", 0o644)

	text, code := run(t, home, "diff", "s")
	for _, want := range []string{"M /t.txt\n", "    content 14 -> 14 bytes", "M /m.txt\n", "    mode 0644 -> 0600", "    owner 0:0 -> 7:8",
		`    xattr user.t added: "v"`, "    target a -> b", `A "/bad\xffname"`} {
		if code != 0 || !strings.Contains(text, want) {
			t.Errorf("diff: no %q in (exit %d)\n%s", want, code, text)
		}
	}
	stat, code := run(t, home, "diff", "s", "--stat")
	for _, want := range []string{"M /bin.dat  3 B -> 4 B  (+1)", "A \"/bad\\xffname\"  - -> 4 B  (+4)", "5 paths changed: 1 added, 4 modified, 0 deleted; +5 bytes, -0 bytes"} {
		if code != 0 || !strings.Contains(stat, want) {
			t.Errorf("diff --stat: no %q in\n%s", want, stat)
		}
	}
	patch, code := run(t, home, "diff", "s", "-p")
	for _, want := range []string{"--- a/t.txt\n+++ b/t.txt\n", "-two\n+TWO\n", "    binary file: 3 B -> 4 B", "--- /dev/null\n"} {
		if code != 0 || !strings.Contains(patch, want) {
			t.Errorf("diff -p: no %q in\n%s", want, patch)
		}
	}
	z, code := run(t, home, "diff", "s", "-z")
	fields := strings.Split(z, "\x00")
	if code != 0 || len(fields) != 11 || fields[10] != "" || fields[0] != "A" || fields[1] != "/"+bad || fields[2] != "M" || fields[3] != "/bin.dat" {
		t.Errorf("diff -z: exit %d %q", code, z)
	}
	if out, code := run(t, home, "diff", "s", "-z", "--stat"); code != exitUsage {
		t.Errorf("diff -z --stat: exit %d: %s", code, out)
	}
	var d diffOut
	runJSON(t, home, &d, "diff", "s", "-p")
	if len(d.Changes) != 5 || d.Changes[0].PathB64 == "" {
		t.Fatalf("diff --json: %+v", d)
	}
	raw, err := base64Decode(d.Changes[0].PathB64)
	if err != nil || raw != "/"+bad || !strings.Contains(d.Changes[0].Path, "\uFFFD") {
		t.Errorf("path_b64 %q decodes to %q (%v), want %q", d.Changes[0].PathB64, raw, err, "/"+bad)
	}
	for _, c := range d.Changes[1:] {
		if c.PathB64 != "" {
			t.Errorf("%s: path_b64 on a UTF-8 name", c.Path)
		}
	}
	if c := d.Changes[3]; c.Path != "/m.txt" || len(c.Meta) != 3 || c.Meta[0].Field != "mode" || c.Meta[0].Old != "0644" || c.Meta[0].New != "0600" {
		t.Errorf("m.txt meta: %+v", c)
	}
	if c := d.Changes[4]; c.Path != "/t.txt" || !strings.Contains(c.Patch, "+TWO") || c.Binary {
		t.Errorf("t.txt patch: %+v", c)
	}
	if c := d.Changes[1]; c.Path != "/bin.dat" || !c.Binary || c.Patch != "" || *c.OldSize != 3 || *c.NewSize != 4 {
		t.Errorf("bin.dat: %+v", c)
	}

	// Between two checkpoints: the same, both sides from the store.
	c0 := checkpoint(t, home)
	os.Remove(live("t.txt"))
	c1 := checkpoint(t, home)
	runJSON(t, home, &d, "diff", "s", c0.ID, c1.ID, "-p")
	if len(d.Changes) != 1 || d.Changes[0].Change != "deleted" || !strings.Contains(d.Changes[0].Patch, "+++ /dev/null") || !strings.Contains(d.Changes[0].Patch, "-TWO") {
		t.Errorf("diff of two checkpoints -p: %+v", d)
	}
	// The checkpoint's ls carries the bad name losslessly too.
	var ls []struct {
		Name    string
		NameB64 string `json:"name_b64"`
	}
	runJSON(t, home, &ls, "ls", c1.ID)
	if raw, _ := base64Decode(ls[0].NameB64); raw != bad {
		t.Errorf("ls --json: %+v", ls[0])
	}
	if out, code := run(t, home, "cat", c1.ID, "/"+bad); code != 0 || out != "new\n" {
		t.Errorf("cat of a non-UTF-8 name: exit %d %q", code, out)
	}
}

// A turn is class fs exactly when its diff is not empty: a copy-up that
// changes nothing visible (touch -a, a chmod to the same mode) is a skip,
// a real chmod is fs and shows in the diff.
func TestCLIClassMatchesDiff(t *testing.T) {
	home, root := newSandbox(t, func(base string) {
		write(t, filepath.Join(base, "f.txt"), "f\n", 0o644)
		write(t, filepath.Join(base, "g.txt"), "g\n", 0o644)
	})
	upper := filepath.Join(home, "sandboxes", "s", "current", "upper")
	agree := func(what, wantClass string, wantDiff []string) {
		t.Helper()
		var d diffOut
		runJSON(t, home, &d, "diff", "s")
		if got := d.paths(); !slices.Equal(got, wantDiff) {
			t.Errorf("%s: diff %v, want %v", what, got, wantDiff)
		}
		if c := checkpoint(t, home); c.Class != wantClass {
			t.Errorf("%s: class %s, want %s", what, c.Class, wantClass)
		}
	}
	// touch -a: only the atime moves, but overlay copies the file up.
	later := []unix.Timespec{unix.NsecToTimespec(time.Now().Add(time.Hour).UnixNano()), {Nsec: unix.UTIME_OMIT}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, "f.txt"), later, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(upper, "f.txt")); err != nil {
		t.Fatalf("touch -a did not copy f.txt up (the case this test is about): %v", err)
	}
	agree("touch -a", "skip", nil)
	if err := os.Chmod(filepath.Join(root, "g.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(upper, "g.txt")); err != nil {
		t.Fatalf("chmod did not copy g.txt up: %v", err)
	}
	agree("same-mode chmod", "skip", nil)
	agree("nothing", "skip", nil)
	os.Chmod(filepath.Join(root, "g.txt"), 0o600)
	agree("chmod 0600", "fs", []string{"m /g.txt"})
	agree("after the chmod", "skip", nil)
	if out, code := run(t, home, "diff", "s"); code != 0 || out != "" {
		t.Errorf("diff after all: exit %d %q", code, out)
	}
}

func base64Decode(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	return string(b), err
}

// On a btrfs root restore writes into the subvolume the same way, and the
// next checkpoint (btrfs finds changes by generation) records it as fs;
// class and diff agree there too.
func TestCLIRestorePathsBtrfs(t *testing.T) {
	testenv.RequireRoot(t)
	pool := btrfstest.Pool(t)
	home := filepath.Join(t.TempDir(), "home")
	base := t.TempDir()
	write(t, filepath.Join(base, "a.txt"), "base a\n", 0o644)
	write(t, filepath.Join(base, "dir", "x"), "x0\n", 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base, "--backend", "btrfs", "--btrfs-pool", pool)
	root := created.Root
	write(t, filepath.Join(root, "dir", "x"), "x1\n", 0o600)
	c1 := checkpoint(t, home)
	write(t, filepath.Join(root, "dir", "x"), "x2\n", 0o644)
	write(t, filepath.Join(root, "dir", "y"), "y\n", 0o644)
	write(t, filepath.Join(root, "a.txt"), "a2\n", 0o644)
	c2 := checkpoint(t, home)
	var r struct {
		Paths []struct{ Path, Action string }
	}
	runJSON(t, home, &r, "restore", "s", c1.ID, "/dir")
	if len(r.Paths) != 1 || r.Paths[0].Action != "restored" {
		t.Fatalf("restore: %+v", r)
	}
	c3 := checkpoint(t, home)
	var d diffOut
	runJSON(t, home, &d, "diff", "s", c2.ID, c3.ID)
	if c3.Class != "fs" || !slices.Equal(d.paths(), []string{"m /dir/x", "d /dir/y"}) {
		t.Fatalf("after restore on btrfs: class %s, diff %v", c3.Class, d.paths())
	}
	runJSON(t, home, &d, "diff", "s", c1.ID, c3.ID)
	if !slices.Equal(d.paths(), []string{"m /a.txt"}) {
		t.Fatalf("diff c1 c3: %v", d.paths())
	}
	// touch -a: no visible change, a skip; a real chmod is fs.
	later := []unix.Timespec{unix.NsecToTimespec(time.Now().Add(time.Hour).UnixNano()), {Nsec: unix.UTIME_OMIT}}
	unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, "a.txt"), later, 0)
	if c := checkpoint(t, home); c.Class != "skip" {
		t.Errorf("touch -a on btrfs: class %s", c.Class)
	}
	os.Chmod(filepath.Join(root, "a.txt"), 0o600)
	runJSON(t, home, &d, "diff", "s")
	if c := checkpoint(t, home); c.Class != "fs" || !slices.Equal(d.paths(), []string{"m /a.txt"}) {
		t.Errorf("chmod on btrfs: class %s, diff %v", c.Class, d.paths())
	}
}

// A restore leaves the sandbox's processes running: the next checkpoint
// is fs (files changed, processes did not), not process or full.
func TestCLIRestoreKeepsProcessesRunning(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		testenv.Missing(t, "runc", "apt package runc")
	}
	if _, err := os.Stat(proc.DefaultCRIUPath()); err != nil {
		testenv.Missing(t, "CRIU", proc.DefaultCRIUPath())
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "busybox", "apt package busybox-static")
	}
	home, root := newSandbox(t, func(base string) {
		for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
			os.MkdirAll(filepath.Join(base, d), 0o755)
		}
		os.WriteFile(filepath.Join(base, "bin/busybox"), bb, 0o755)
		for _, a := range []string{"sh", "sleep"} {
			os.Symlink("busybox", filepath.Join(base, "bin", a))
		}
		write(t, filepath.Join(base, "etc", "app.conf"), "good\n", 0o644)
	})
	c0 := checkpoint(t, home)
	if out, code := run(t, home, "exec", "s", "--detach", "--", "sleep", "1000"); code != 0 {
		t.Fatalf("exec --detach: %d %s", code, out)
	}
	if c := checkpoint(t, home); c.Class != "process" {
		t.Fatalf("turn that started sleep: class %s", c.Class)
	}
	write(t, filepath.Join(root, "etc", "app.conf"), "broken\n", 0o644)
	if c := checkpoint(t, home); c.Class != "fs" {
		t.Fatalf("turn that broke app.conf: class %s", c.Class)
	}
	if out, code := run(t, home, "restore", "s", c0.ID, "/etc/app.conf"); code != 0 {
		t.Fatalf("restore: exit %d: %s", code, out)
	}
	if got := readFile(t, filepath.Join(root, "etc", "app.conf")); got != "good\n" {
		t.Fatalf("app.conf: %q", got)
	}
	if c := checkpoint(t, home); c.Class != "fs" {
		t.Fatalf("turn after restore with a process running: class %s, want fs", c.Class)
	}
}
