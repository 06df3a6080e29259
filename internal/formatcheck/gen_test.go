package formatcheck

// The fixture generator: the only file here that uses turnsnap's own code.
// It makes real buckets with today's engine (overlay roots, a MinIO server,
// a push) and records beside each what the writer wrote: every
// checkpoint's record fields and what its sandbox showed, walked from the
// mounted root, and every ref's target and owner. reader_test.go reads the
// buckets from docs/FORMAT.md alone and compares.
//
// It is skipped unless -update is given, so `go test` needs nothing but the
// checked-in testdata. Regenerate (as root, with MinIO built by make deps):
//
//	go test -count=1 -run TestWriteFixtures ./internal/formatcheck -update
//
// It rewrites testdata/bucket, testdata/sealed (an encrypted home's bucket
// and its key file), testdata/sealed-plainlocal (the same of a home whose
// local store is plaintext) and testdata/damaged (a damaged copy of testdata/store),
// with their manifests. testdata/store (record and tree version 1) and
// testdata/store-v3 (the first chunk lists) were written by older writers
// and are kept as they are: the old formats every reader must still read.

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/llmproxy"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "regenerate the fixture buckets with the real engine (root, overlayfs, MinIO)")

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
			x.Size = int64(len(b))
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
		case syscall.S_IFCHR:
			x.Type, x.Rdev = "chardev", st.Rdev
		case syscall.S_IFBLK:
			x.Type, x.Rdev = "blockdev", st.Rdev
		case syscall.S_IFIFO:
			x.Type = "fifo"
		case syscall.S_IFSOCK:
			x.Type = "socket"
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestWriteFixtures(t *testing.T) {
	if !*update {
		t.Skip("the fixtures are checked in; -update regenerates them (root, overlayfs, MinIO)")
	}
	t.Run("bucket", func(t *testing.T) { writeBucket(t, "bucket", false, false) })
	t.Run("sealed", func(t *testing.T) { writeBucket(t, "sealed", true, false) })
	t.Run("sealed-plainlocal", func(t *testing.T) { writeBucket(t, "sealed-plainlocal", true, true) })
	t.Run("damaged", writeDamaged)
}

// gen is one generator run: an engine whose remote is a fresh bucket, and
// the manifest of what it wrote.
type gen struct {
	t   *testing.T
	ctx context.Context
	e   *engine.Engine
	m   Manifest
}

// remember records checkpoint id as the writer made it (its record, by the
// engine's log) and what root showed when it was taken; journal is the
// model exchanges its journal holds, if the writer gave it one.
func (g *gen) remember(sandbox string, id delta.ID, root string, journal map[string]JournalExpect) {
	g.t.Helper()
	log, err := g.e.History().Log(g.ctx, delta.SandboxName(sandbox))
	must(g.t, err)
	for _, le := range log {
		if le.ID != id {
			continue
		}
		c := CheckpointManifest{Version: le.Version, Class: string(le.Class), SandboxID: le.SandboxID, ProcChange: le.ProcChange, Files: listing(g.t, root)}
		if le.Conv != nil {
			c.Conv = le.Conv.String()
		}
		if le.Journal != nil {
			c.Journal = journal
		}
		c.ProcImage = le.ProcTree != nil
		g.m.Checkpoints[id.String()] = c
		return
	}
	g.t.Fatalf("checkpoint %s not in the log of %s", id.Short(), sandbox)
}

func writeBucket(t *testing.T, name string, sealed, plainLocal bool) {
	ctx := context.Background()
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	home := filepath.Join(t.TempDir(), "home")
	e, err := engine.Open(ctx, engine.Options{Home: home})
	must(t, err)
	defer e.Close()
	g := &gen{t: t, ctx: ctx, e: e, m: Manifest{Checkpoints: map[string]CheckpointManifest{}, Refs: map[string]RefManifest{}, Marks: map[string][]string{}}}
	rc := engine.RemoteConfig{URL: "s3://" + name, Endpoint: srv.Endpoint, Insecure: true}
	setup := engine.SetupOptions{Remote: &rc}
	keyFile := filepath.Join("testdata", name+".key")
	if sealed {
		os.Remove(keyFile)
		_, err := keys.GenerateKeyFile(keyFile)
		must(t, err)
		setup.KeyFile, setup.PlainLocal = keyFile, plainLocal
		g.m.KeyFile = name + ".key"
	}
	_, err = e.HomeSetup().Setup(ctx, setup)
	must(t, err)

	// The base: every entry type a base may hold, a file of more than 16
	// chunks (a chunk list: tree version 3 at the root), a sparse file in
	// a directory of its own (tree version 2 there), plain trees elsewhere.
	base := t.TempDir()
	sh(t, base, `
printf 'base\n' > a.txt
mkdir dir dir2 opq holes; printf 'sub\n' > dir/sub.txt; printf 'keep\n' > dir2/keep; printf 'old\n' > opq/old
ln -s a.txt link; : > empty; printf 'linked\n' > hard1; ln hard1 hard2
i=0; while [ $i -lt 6000 ]; do echo "line $i of a compressible file that spans chunks"; i=$((i+1)); done > big.txt
i=0; while [ $i -lt 60000 ]; do echo "line $i of a file of more than sixteen chunks, so that it names a chunk list"; i=$((i+1)); done > huge.txt
truncate -s 3000000 holes/sparse; printf 'data in the middle\n' | dd of=holes/sparse bs=1 seek=1048576 conv=notrunc status=none
printf 'tail\n' | dd of=holes/sparse bs=1 seek=2999995 conv=notrunc status=none
mkfifo fifo; mknod null c 1 3; mknod loop0 b 7 0
touch -d @1700000000 a.txt empty hard1 big.txt huge.txt dir/sub.txt dir2/keep opq/old holes/sparse fifo null loop0`)
	if !sealed {
		// A unix socket node (bind leaves it behind).
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		must(t, err)
		must(t, unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(base, "sock")}))
		unix.Close(fd)
		must(t, unix.UtimesNano(filepath.Join(base, "sock"), []unix.Timespec{{Sec: 1700000000}, {Sec: 1700000000}}))
	}
	must(t, unix.Setxattr(filepath.Join(base, "a.txt"), "user.note", []byte("hello"), 0))
	must(t, unix.UtimesNano(filepath.Join(base, "a.txt"), []unix.Timespec{{Sec: 1700000000}, {Sec: 1700000000}}))

	cr, err := e.CreateSandbox(ctx, "agent", engine.CreateOptions{Base: base})
	must(t, err)
	defer e.RemoveSandbox(ctx, "agent")
	g.remember("agent", cr.Checkpoint.ID, cr.Root, nil)

	// Turn 1, closed by a model call (record version 3): whiteouts, an
	// opaque directory, hardlinks in the layer, a sparse file in the layer,
	// and a file whose bytes are a tree's encoding (the empty tree, which
	// the store already holds as a tree: "Content IDs").
	sh(t, cr.Root, `
printf 'edited\n' > a.txt; rm dir/sub.txt; rm -rf opq; mkdir opq; printf 'new\n' > opq/n
touch dir2/tmp; rm dir2/tmp; mkdir newdir; printf 'f\n' > newdir/f; ln newdir/f newdir/g; : > newdir/empty
printf 'TST\001\000' > newdir/tree-bytes
truncate -s 200000 newdir/sparse; printf 'x' | dd of=newdir/sparse bs=1 seek=100000 conv=notrunc status=none
touch -d @1700000100 a.txt opq/n newdir/f newdir/empty newdir/tree-bytes newdir/sparse`)
	// The model call that closed it goes into the sandbox's journal, whole
	// ("TSJ1").
	j := llmproxy.NewTreeJournal(e.Keys().IDs(), e.Blobs())
	req0 := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("You are a careful agent. ", 60) + `"},{"role":"user","content":"turn one"}]}`)
	conv := delta.Hash([]byte("formatcheck conversation"))
	j1 := map[string]JournalExpect{}
	journalPut(t, j, j1, conv, 0, req0, []byte(`{"choices":[{"message":{"content":"one"}}]}`))
	snap := j.Snapshot("agent", 1)
	c1, err := e.Checkpoint(ctx, "agent", engine.CheckpointOptions{Message: "turn one", Conv: &conv, Journal: snap.Save})
	must(t, err)
	j.Committed(ctx, snap)
	g.remember("agent", c1.ID, cr.Root, j1)
	if _, err := e.History().Tag(ctx, "good", mustRef(c1.ID.String())); err != nil {
		t.Fatal(err)
	}

	// Turn 2 changes nothing and is recorded on request: class skip.
	c2, err := e.Checkpoint(ctx, "agent", engine.CheckpointOptions{RecordSkips: true})
	must(t, err)
	g.remember("agent", c2.ID, cr.Root, j1)

	// Turn 3: a second indirect file, in the layer.
	sh(t, cr.Root, `i=0; while [ $i -lt 50000 ]; do echo "another large file, line $i, named by a chunk list in the writable layer"; i=$((i+1)); done > newdir/huge2; touch -d @1700000300 newdir/huge2`)
	// Its model call extends turn one's request: a "TSJ2" delta against it,
	// in a journal tree whose "prev" is turn one's.
	conv3 := delta.Hash([]byte("formatcheck conversation, turn three"))
	j3 := map[string]JournalExpect{}
	for k, v := range j1 {
		j3[k] = v
	}
	req2 := append(append([]byte(nil), req0[:len(req0)-2]...), []byte(`,{"role":"assistant","content":"one"},{"role":"user","content":"turn three"}]}`)...)
	journalPut(t, j, j3, conv3, 2, req2, []byte(`{"choices":[{"message":{"content":"three"}}]}`))
	snap = j.Snapshot("agent", 3)
	c3, err := e.Checkpoint(ctx, "agent", engine.CheckpointOptions{Conv: &conv3, Journal: snap.Save})
	must(t, err)
	j.Committed(ctx, snap)
	g.remember("agent", c3.ID, cr.Root, j3)

	br, err := e.Branch(ctx, mustRef(c1.ID.String()), "copy", engine.BranchOptions{})
	must(t, err)
	defer e.RemoveSandbox(ctx, "copy")
	sh(t, br.Root, `rm a.txt; printf 'copy\n' > c.txt; touch -d @1700000200 c.txt`)
	c4, err := e.Checkpoint(ctx, "copy", engine.CheckpointOptions{})
	must(t, err)
	g.remember("copy", c4.ID, br.Root, j1)

	if !sealed {
		defer e.RemoveSandbox(ctx, "procs")
		g.processes()
	}

	// Two-phase retention leaves a mark object: turn 0 and the skip record
	// of agent are marked, not deleted (a head and a tag keep the rest).
	pr, err := e.Retention().Prune(ctx, retention.PruneOptions{KeepLast: 1, Grace: time.Hour})
	must(t, err)
	homeID := readHomeID(t, home)
	for _, m := range pr.Marked {
		g.m.Marks[delta.MarkName(homeID)] = append(g.m.Marks[delta.MarkName(homeID)], m.ID.String())
	}
	if len(pr.Marked) == 0 || len(pr.Deleted) != 0 {
		t.Fatalf("prune marked %d, deleted %d", len(pr.Marked), len(pr.Deleted))
	}
	_, err = e.Remote().Push(ctx, engine.PushOptions{})
	must(t, err)

	sbs, err := e.ListSandboxes(ctx)
	must(t, err)
	for _, sb := range sbs {
		// A pushed head carries its owner: the creating home, epoch 1.
		g.m.Refs[delta.HeadObject(sb.Sandbox.Key())] = RefManifest{Target: sb.Head.ID.String(), Owner: sb.Sandbox.Home, Epoch: 1}
	}
	g.m.Refs[delta.RefName(delta.RefTag, "good")] = RefManifest{Target: c1.ID.String()}

	dst := filepath.Join("testdata", name)
	must(t, os.RemoveAll(dst))
	s3, err := upload.NewS3(ctx, upload.S3Config{Endpoint: srv.Endpoint, Bucket: name, Insecure: true})
	must(t, err)
	must(t, s3.List(ctx, "", func(oi upload.ObjectInfo) error {
		rc, err := s3.Get(ctx, oi.Name)
		if err != nil {
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			return err
		}
		p := filepath.Join(dst, filepath.FromSlash(oi.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, b, 0o644)
	}))
	writeJSON(t, filepath.Join("testdata", name+".json"), g.m)
}

// journalPut records one model exchange in j and in the manifest's view
// of the journal, want.
func journalPut(t *testing.T, j *llmproxy.TreeJournal, want map[string]JournalExpect, conv delta.ID, turn int, req, resp []byte) {
	must(t, j.Put(context.Background(), "agent", &llmproxy.Entry{Conv: conv, Turn: turn, Shape: llmproxy.ShapeChat,
		Status: 200, ContentType: "application/json", Request: req, Response: resp}))
	want[conv.String()+"."+strconv.Itoa(turn)] = JournalExpect{Request: blake3Hex(string(req)), Response: blake3Hex(string(resp))}
}

// processes makes a checkpoint with a process image (record version 4)
// in a sandbox whose base is two small static programs: testdata/tinysh.c
// stands in for the /bin/sh the container's keeper and turnsnap's detach
// run, and as "pause" only sleeps. A busybox base would pass 1 MB.
func (g *gen) processes() {
	t := g.t
	if _, err := exec.LookPath("runc"); err != nil {
		t.Fatalf("the process image needs runc: %v", err)
	}
	base := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "root"} {
		must(t, os.MkdirAll(filepath.Join(base, d), 0o755))
	}
	src, err := filepath.Abs(filepath.Join("testdata", "tinysh.c"))
	must(t, err)
	sh(t, base, "gcc -static -nostdlib -Os -fno-stack-protector -fno-asynchronous-unwind-tables -Wl,--build-id=none -s -o bin/sh "+src+
		" && ln -s sh bin/pause && touch -h -d @1700000000 bin/sh bin/pause")
	cr, err := g.e.CreateSandbox(g.ctx, "procs", engine.CreateOptions{Base: base})
	must(t, err)
	g.remember("procs", cr.Checkpoint.ID, cr.Root, nil)
	_, err = g.e.Processes().Exec(g.ctx, "procs", []string{"/bin/pause"}, engine.ExecOptions{Detach: true})
	must(t, err)
	time.Sleep(300 * time.Millisecond)
	c, err := g.e.Checkpoint(g.ctx, "procs", engine.CheckpointOptions{})
	must(t, err)
	if c.ProcessChange == "" {
		t.Fatalf("a turn that started a process: class %s, no process change", c.Class)
	}
	g.remember("procs", c.ID, cr.Root, nil)
}

func readHomeID(t *testing.T, home string) string {
	b, err := os.ReadFile(filepath.Join(home, "config.json"))
	must(t, err)
	var c struct {
		HomeID string `json:"home_id"`
	}
	must(t, json.Unmarshal(b, &c))
	return c.HomeID
}

func writeJSON(t *testing.T, path string, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", " ")
	must(t, enc.Encode(v))
	must(t, os.WriteFile(path, b.Bytes(), 0o644))
}

// writeDamaged copies testdata/store with three damages, and says in
// damaged.json which object each one hit: a byte flipped in the middle of
// a pack, a record cut short, and the record a head names deleted.
func writeDamaged(t *testing.T) {
	src, dst := filepath.Join("testdata", "store"), filepath.Join("testdata", "damaged")
	must(t, os.RemoveAll(dst))
	sh(t, ".", "cp -a "+src+" "+dst)
	var d Damage
	var packs, records []string
	must(t, filepath.WalkDir(dst, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		name := filepath.ToSlash(strings.TrimPrefix(p, dst+"/"))
		switch {
		case strings.HasPrefix(name, "packs/"):
			packs = append(packs, name)
		case strings.HasPrefix(name, "records/"):
			records = append(records, name)
		}
		return nil
	}))
	sort.Strings(packs)
	sort.Strings(records)
	// The largest pack holds chunks several records need.
	sort.SliceStable(packs, func(i, j int) bool { return size(t, dst, packs[i]) > size(t, dst, packs[j]) })
	d.Flipped = packs[0]
	b, err := os.ReadFile(filepath.Join(dst, d.Flipped))
	must(t, err)
	b[len(b)/3] ^= 0x40
	must(t, os.WriteFile(filepath.Join(dst, d.Flipped), b, 0o644))
	// A head's record goes missing; another record is cut short.
	heads, err := filepath.Glob(filepath.Join(dst, "refs", "heads", "*"))
	must(t, err)
	sort.Strings(heads)
	hb, err := os.ReadFile(heads[0])
	must(t, err)
	d.Missing = "records/" + strings.TrimSpace(string(hb))
	must(t, os.Remove(filepath.Join(dst, d.Missing)))
	for _, r := range records {
		if r != d.Missing {
			d.Truncated = r
			break
		}
	}
	rb, err := os.ReadFile(filepath.Join(dst, d.Truncated))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dst, d.Truncated), rb[:len(rb)/2], 0o644))
	writeJSON(t, filepath.Join("testdata", "damaged.json"), d)
}

func size(t *testing.T, dir, name string) int64 {
	st, err := os.Stat(filepath.Join(dir, name))
	must(t, err)
	return st.Size()
}

// canonLess is "Tree" rule 6's canonical order of two root-relative paths,
// split into names: depth first, a directory right before its children.
func canonLess(a, b []string) bool {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// mustRef parses a checkpoint reference the generator holds. It lives
// here, in the one file that may import the writer's packages
// (TestReaderImportsNoTurnsnapPackage), and panics on a reference that
// does not parse: a mistake of the generator's.
func mustRef(s string) catalog.CheckpointRef {
	r, err := catalog.ParseCheckpointRef(s)
	if err != nil {
		panic(err)
	}
	return r
}
