package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// These tests need root, overlayfs, a real MinIO (scripts/deps.d/40-minio.sh)
// and, for the process part, runc and CRIU (scripts/deps.d/30-proc.sh).

// filesHolding lists the files under dir whose bytes contain marker.
func filesHolding(t *testing.T, dir string, marker []byte) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, marker) {
			out = append(out, p)
		}
		return nil
	})
	must(t, err)
	return out
}

func newMarker(kind string) string {
	b := make([]byte, 12)
	rand.Read(b)
	return "TSMARK-" + kind + "-" + hex.EncodeToString(b)
}

// incompressible is random bytes with marker in the middle: stored as is
// (zstd would not save 1/16), so in a plaintext store the marker shows in
// the bucket's bytes, which the control case below relies on.
func incompressible(marker string) string {
	b := make([]byte, 96<<10)
	rand.Read(b)
	copy(b[40<<10:], marker)
	return string(b)
}

func keyFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "master.key")
	_, err := keys.GenerateKeyFile(p)
	must(t, err)
	return p
}

// With a key, a marker written into a sandbox file and held in a sandbox
// process's memory reaches the bucket (it comes back on another host) but
// appears in no byte of it, nor of the local store or catalog. Without the
// key, or with another, a fresh home fails with ErrKey.
func TestEncryptedBucketHoldsNoPlaintext(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	srv := startMinIO(t)
	key := keyFile(t)
	rc := remoteCfg(srv.Endpoint, "sealed")

	a := newEngine(t)
	_, err := a.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: key})
	must(t, err)
	cr, err := a.CreateSandbox(ctx, "cryptsb", CreateOptions{Base: busyboxBase(t)})
	must(t, err)
	fileMark, memMark := newMarker("FILE"), newMarker("MEM")
	write(t, filepath.Join(cr.Root, "root/secret.txt"), "token="+fileMark+"\n")
	write(t, filepath.Join(cr.Root, "root/secret.bin"), incompressible(fileMark))
	// The marker lives only in the process: its argv and a shell variable.
	_, err = a.Processes().Exec(ctx, "cryptsb", []string{"sh", "-c", "m=" + memMark + "; while :; do sleep 0.1; done"}, ExecOptions{Detach: true})
	must(t, err)
	time.Sleep(1500 * time.Millisecond) // as the counter test: the detached start settles
	cp, err := a.Checkpoint(ctx, "cryptsb", CheckpointOptions{})
	must(t, err)
	if cp.Class != delta.ClassFull {
		t.Fatalf("turn with a file and a process classed %s", cp.Class)
	}
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	must(t, a.Close()) // flush the catalog before grepping its files
	for _, m := range []string{fileMark, memMark} {
		for _, dir := range []string{srv.Dir, a.home.storeDir(), a.home.catalogDir()} {
			if got := filesHolding(t, dir, []byte(m)); len(got) > 0 {
				t.Errorf("marker %s in plaintext in %v", m[:12], got)
			}
		}
	}
	if n := len(filesHolding(t, srv.Dir, []byte("refs/heads"))); n > 0 {
		t.Logf("object names are visible in MinIO's own metadata (%d files), as docs/SECURITY.md says", n)
	}
	openEngine(t, string(a.home))

	// Another host with the key restores files and processes from the bucket.
	b := newEngine(t)
	_, err = b.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: key})
	must(t, err)
	rep, err := b.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	if rep.Checkpoints != 2 {
		t.Fatalf("rebuild from the sealed bucket found %d checkpoints, want 2", rep.Checkpoints)
	}
	br, err := b.Branch(ctx, mustRef(cp.ID.String()), "cryptcopy", BranchOptions{})
	must(t, err)
	if !br.Processes {
		t.Fatal("branch restored no processes")
	}
	if got, _ := os.ReadFile(filepath.Join(br.Root, "root/secret.txt")); !strings.Contains(string(got), fileMark) {
		t.Fatalf("restored file holds %q", got)
	}
	if out := sh(t, b, "cryptcopy", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); !strings.Contains(out, memMark) {
		t.Fatalf("restored processes do not hold the marker: %q", out)
	}
	_, err = b.Verifier().Verify(ctx, mustRef(cp.ID.String()))
	must(t, err)

	// A fresh home without the key, and one with another key, fail cleanly.
	c := newEngine(t)
	if _, err := c.HomeSetup().Init(ctx, rc); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("init of a sealed bucket without a key: %v, want ErrKey", err)
	}
	d := newEngine(t)
	if _, err := d.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: keyFile(t)}); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("init with another key: %v, want ErrKey", err)
	}
	// A home whose key file went away does not open.
	home := string(b.home)
	must(t, b.Close())
	must(t, os.Rename(key, key+".gone"))
	if _, err := Open(ctx, Options{Home: home}); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("open without the key file: %v, want ErrKey", err)
	}
	must(t, os.Rename(key+".gone", key))
	openEngine(t, home) // removes its sandboxes at cleanup

	// The control: without a key the same kind of file shows in the bucket,
	// so the greps above could have failed.
	p := newEngine(t)
	_, err = p.HomeSetup().Init(ctx, remoteCfg(srv.Endpoint, "plain"))
	must(t, err)
	pr, err := p.CreateSandbox(ctx, "p", CreateOptions{Base: richBase(t)})
	must(t, err)
	plainMark := newMarker("PLAIN")
	write(t, filepath.Join(pr.Root, "secret.bin"), incompressible(plainMark))
	_, err = p.Checkpoint(ctx, "p", CheckpointOptions{})
	must(t, err)
	_, err = p.Remote().Push(ctx, PushOptions{})
	must(t, err)
	if len(filesHolding(t, srv.Dir, []byte(plainMark))) == 0 {
		t.Fatal("control: a plaintext bucket does not show the marker either; the grep proves nothing")
	}
}

// Rotating the master key rewraps the data key: the old key no longer
// opens the home, the new one opens everything, and no data object changed.
func TestRotateKeyRewrapsOnly(t *testing.T) {
	ctx := context.Background()
	k1 := keyFile(t)
	e := newEngine(t)
	_, err := e.HomeSetup().Setup(ctx, SetupOptions{KeyFile: k1})
	must(t, err)
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	agentTurn(t, cr.Root)
	cp, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	rawLocal, _ := e.keys.Raw()
	before := countObjects(t, rawLocal)
	k2 := keyFile(t)
	r, err := e.Keys().Rotate(ctx, k2)
	must(t, err)
	if after := countObjects(t, rawLocal); after != before {
		t.Fatalf("rotation changed the object count %d -> %d", before, after)
	}
	if _, err := rawLocal.Stat(ctx, delta.KeyName(r.OldKey)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("old key object still there: %v", err)
	}
	_, err = e.Verifier().Verify(ctx, mustRef(cp.ID.String()))
	must(t, err)
	home := string(e.home)
	must(t, e.Close())
	// The home now needs k2; k1 (through a new home) no longer opens it.
	o := openEngine(t, home)
	_, err = o.Verifier().Verify(ctx, mustRef(cp.ID.String()))
	must(t, err)
	must(t, o.Close())
	x := newEngine(t)
	must(t, os.CopyFS(x.home.storeDir(), os.DirFS(filepath.Join(home, "store"))))
	if _, err := x.HomeSetup().Setup(ctx, SetupOptions{KeyFile: k1}); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("old key after rotation: %v, want ErrKey", err)
	}
	// x holds a store it has no key for; empty it for the cleanup's checker.
	for _, d := range []string{"packs", "records", "refs", "sandboxes", "keys"} {
		must(t, os.RemoveAll(filepath.Join(x.home.storeDir(), d)))
	}
	openEngine(t, home)
}
