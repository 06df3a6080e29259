//go:build fixturegen

package formatcheck

// Regenerate the fixture (as root): go test -tags fixturegen -run TestWriteFixture ./internal/formatcheck
// It writes testdata/store-v3 and expected-v3.json. testdata/store and
// expected.json were written before indirect chunk lists (without huge.txt)
// and are kept as they are: the old format every reader must still read.
// It is the only file here that uses turnsnap's own code: it makes a real
// store and records what a sandbox showed at each checkpoint, by walking
// the mounted root, for the reader to compare against.

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-ec", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// listing walks a mounted root the way a user sees it.
func listing(t *testing.T, root string) map[string]Expect {
	t.Helper()
	out := map[string]Expect{}
	first := map[uint64]string{} // inode -> first path in canonical order
	var paths []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	})
	sort.Slice(paths, func(i, j int) bool {
		return canonLess(strings.Split(strings.TrimPrefix(paths[i], root+"/"), "/"), strings.Split(strings.TrimPrefix(paths[j], root+"/"), "/"))
	})
	for _, p := range paths {
		rel := strings.TrimPrefix(p, root+"/")
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		x := Expect{Mode: st.Mode & 07777}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			x.Type = "file"
			b, _ := os.ReadFile(p)
			sum := blake3.Sum256(b)
			x.Content = hex.EncodeToString(sum[:])
			if st.Nlink > 1 {
				if f, ok := first[st.Ino]; ok {
					x = Expect{Type: "hardlink", Target: f}
				} else {
					first[st.Ino] = rel
				}
			}
		case syscall.S_IFDIR:
			x.Type = "dir"
		case syscall.S_IFLNK:
			x.Type = "symlink"
			x.Target, _ = os.Readlink(p)
			x.Mode = 0
		}
		if x.Type != "dir" && x.Type != "hardlink" && x.Type != "symlink" {
			x.MtimeNs = unix.TimespecToNsec(st.Mtim)
		}
		if x.Type == "file" || x.Type == "dir" {
			buf := make([]byte, 4096)
			n, _ := unix.Llistxattr(p, buf)
			for _, name := range strings.Split(string(buf[:max(n, 0)]), "\x00") {
				if name == "" || strings.HasPrefix(name, "trusted.overlay.") {
					continue
				}
				v := make([]byte, 4096)
				m, _ := unix.Lgetxattr(p, name, v)
				if x.Xattrs == nil {
					x.Xattrs = map[string]string{}
				}
				x.Xattrs[name] = string(v[:m])
			}
		}
		out[rel] = x
	}
	return out
}

func TestWriteFixture(t *testing.T) {
	ctx := context.Background()
	home := filepath.Join(t.TempDir(), "home")
	e, err := engine.Open(ctx, engine.Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	base := t.TempDir()
	sh(t, base, `
printf 'base\n' > a.txt
mkdir dir dir2 opq; printf 'sub\n' > dir/sub.txt; printf 'keep\n' > dir2/keep; printf 'old\n' > opq/old
ln -s a.txt link; : > empty; printf 'linked\n' > hard1; ln hard1 hard2
i=0; while [ $i -lt 6000 ]; do echo "line $i of a compressible file that spans chunks"; i=$((i+1)); done > big.txt
i=0; while [ $i -lt 60000 ]; do echo "line $i of a file of more than sixteen chunks, so that it names a chunk list"; i=$((i+1)); done > huge.txt
touch -d @1700000000 a.txt empty hard1 big.txt huge.txt dir/sub.txt dir2/keep opq/old`)
	if err := unix.Setxattr(filepath.Join(base, "a.txt"), "user.note", []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	unix.UtimesNano(filepath.Join(base, "a.txt"), []unix.Timespec{{Sec: 1700000000}, {Sec: 1700000000}})
	want := map[string]map[string]Expect{}
	cr, err := e.CreateSandbox(ctx, "agent", engine.CreateOptions{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	defer e.RemoveSandbox(ctx, "agent")
	want[cr.Checkpoint.ID.String()] = listing(t, cr.Root)
	sh(t, cr.Root, `
printf 'edited\n' > a.txt; rm dir/sub.txt; rm -rf opq; mkdir opq; printf 'new\n' > opq/n
touch dir2/tmp; rm dir2/tmp; mkdir newdir; printf 'f\n' > newdir/f; ln newdir/f newdir/g; : > newdir/empty
touch -d @1700000100 a.txt opq/n newdir/f newdir/empty`)
	c1, err := e.Checkpoint(ctx, "agent", engine.CheckpointOptions{Message: "turn one"})
	if err != nil {
		t.Fatal(err)
	}
	want[c1.ID.String()] = listing(t, cr.Root)
	if _, err := e.Tag(ctx, "good", c1.ID.String()); err != nil {
		t.Fatal(err)
	}
	br, err := e.Branch(ctx, c1.ID.String(), "copy", engine.BranchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.RemoveSandbox(ctx, "copy")
	sh(t, br.Root, `rm a.txt; printf 'copy\n' > c.txt; touch -d @1700000200 c.txt`)
	c2, err := e.Checkpoint(ctx, "copy", engine.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want[c2.ID.String()] = listing(t, br.Root)

	dst := filepath.Join("testdata", "store-v3")
	os.RemoveAll(dst)
	sh(t, ".", "mkdir -p testdata && cp -a "+filepath.Join(home, "store")+" "+dst+" && rm -rf "+filepath.Join(dst, ".tmp"))
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", " ")
	if err := enc.Encode(want); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "expected-v3.json"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
