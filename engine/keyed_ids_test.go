package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/keys"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/overlay"
	"github.com/turnsnap/turnsnap/upload"
)

// fileChunks returns the chunk IDs of the top-level file name in
// checkpoint id's writable layer.
func fileChunks(t *testing.T, e *Engine, id delta.ID, name string) []delta.ID {
	t.Helper()
	ctx := context.Background()
	var cp *delta.Checkpoint
	must(t, e.cat.View(ctx, func(tx *catalog.Tx) error {
		var err error
		cp, err = tx.Checkpoint(id)
		return err
	}))
	tree, err := delta.LoadTree(ctx, e.data.repo, cp.FSTree)
	must(t, err)
	for _, en := range tree.Entries {
		if en.Name == name {
			return en.Chunks
		}
	}
	t.Fatalf("checkpoint %s: no file %s", id.Short(), name)
	return nil
}

// plainChunks cuts data as a scan does and names the chunks under ids.
func plainChunks(t *testing.T, ids delta.IDs, data []byte) []delta.ID {
	t.Helper()
	var out []delta.ID
	must(t, delta.ChunkReader(bytes.NewReader(data), func(c []byte) error {
		out = append(out, ids.Hash(c))
		return nil
	}))
	return out
}

// contentNames lists the content-addressed objects (packs, records) of s.
func contentNames(t *testing.T, s upload.Store) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, p := range []string{delta.PackPrefix, delta.RecordPrefix} {
		must(t, s.List(context.Background(), p, func(oi upload.ObjectInfo) error {
			out[oi.Name] = true
			return nil
		}))
	}
	return out
}

// Two tenants (their own key, their own prefix of one bucket) storing the
// same 1 MiB file get unrelated chunk IDs and share no object name; under
// one key the file is stored once; a plaintext home names it with plain
// BLAKE3 as before; a fresh home with the key restores it and verifies;
// a home whose config disagrees with its store's scheme does not open.
func TestKeyedIDsPerKey(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	big := make([]byte, 1<<20)
	rand.Read(big)
	rcA := RemoteConfig{URL: "s3://shared/tenant-a", Endpoint: srv.Endpoint, Insecure: true}
	rcB := RemoteConfig{URL: "s3://shared/tenant-b", Endpoint: srv.Endpoint, Insecure: true}
	kA, kB := keyFile(t), keyFile(t)

	a, b, p := newEngine(t), newEngine(t), newEngine(t)
	_, err := a.HomeSetup().Setup(ctx, SetupOptions{Remote: &rcA, KeyFile: kA})
	must(t, err)
	_, err = b.HomeSetup().Setup(ctx, SetupOptions{Remote: &rcB, KeyFile: kB})
	must(t, err)
	cps := map[*Engine]delta.ID{}
	for _, e := range []*Engine{a, b, p} {
		cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
		must(t, err)
		write(t, filepath.Join(cr.Root, "big.bin"), string(big))
		cp, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
		must(t, err)
		cps[e] = cp.ID
	}
	if a.config.Encryption.IDs != delta.SchemeKeyed || !a.keys.IDs().Keyed() || p.keys.IDs().Keyed() {
		t.Fatalf("schemes: encrypted home %q (keyed %v), plaintext home keyed %v", a.config.Encryption.IDs, a.keys.IDs().Keyed(), p.keys.IDs().Keyed())
	}
	ca, cb, cpl := fileChunks(t, a, cps[a], "big.bin"), fileChunks(t, b, cps[b], "big.bin"), fileChunks(t, p, cps[p], "big.bin")
	if want := plainChunks(t, delta.IDs{}, big); !slices.Equal(cpl, want) {
		t.Fatal("a plaintext home's chunk IDs are not plain BLAKE3 of the chunks")
	}
	if want := plainChunks(t, a.keys.IDs(), big); !slices.Equal(ca, want) {
		t.Fatal("an encrypted home's chunk IDs are not its keyed IDs")
	}
	seen := map[delta.ID]string{}
	for name, ids := range map[string][]delta.ID{"tenant a": ca, "tenant b": cb, "plaintext": cpl} {
		for _, id := range ids {
			if other, ok := seen[id]; ok && other != name {
				t.Fatalf("chunk %s is named alike in %s and %s", id.Short(), other, name)
			}
			seen[id] = name
		}
	}

	// Under one key equal content is stored once.
	cr, err := a.CreateSandbox(ctx, "s2", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "big.bin"), string(big))
	cp2, err := a.Checkpoint(ctx, "s2", CheckpointOptions{})
	must(t, err)
	if !slices.Equal(fileChunks(t, a, cp2.ID, "big.bin"), ca) {
		t.Fatal("the same file under the same key has other chunk IDs")
	}
	if cp2.Stats.BytesNew >= 64<<10 {
		t.Fatalf("the second copy of a 1 MiB file stored %d new bytes: dedup under one key is lost", cp2.Stats.BytesNew)
	}

	for _, e := range []*Engine{a, b} {
		_, err := e.Remote().Push(ctx, PushOptions{})
		must(t, err)
	}
	_, aRemote := a.keys.Raw()
	_, bRemote := b.keys.Raw()
	na, nb := contentNames(t, aRemote), contentNames(t, bRemote)
	if len(na) == 0 || len(nb) == 0 {
		t.Fatalf("the tenants pushed %d and %d content objects", len(na), len(nb))
	}
	for n := range na {
		if nb[n] {
			t.Errorf("object %s is in both tenants' prefixes", n)
		}
	}

	// A fresh home with tenant a's key restores from the bucket and verifies.
	c := newEngine(t)
	_, err = c.HomeSetup().Setup(ctx, SetupOptions{Remote: &rcA, KeyFile: kA})
	must(t, err)
	if c.config.Encryption.IDs != delta.SchemeKeyed || c.keys.IDs() != a.keys.IDs() {
		t.Fatalf("the fresh home's scheme is %q, not its store's", c.config.Encryption.IDs)
	}
	_, err = c.Rebuilder().RebuildCatalog(ctx)
	must(t, err)
	_, err = c.Verifier().Verify(ctx, mustRef(cps[a].String()))
	must(t, err)
	br, err := c.Branch(ctx, mustRef(cps[a].String()), "copy", BranchOptions{})
	must(t, err)
	if got, err := os.ReadFile(filepath.Join(br.Root, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("restored file: %d bytes, %v", len(got), err)
	}

	// A config that says plain IDs for a keyed store is refused at open.
	home := string(c.home)
	must(t, c.Close())
	cfg, err := os.ReadFile(c.home.configFile())
	must(t, err)
	var m map[string]any
	must(t, json.Unmarshal(cfg, &m))
	delete(m["encryption"].(map[string]any), "ids")
	tampered, _ := json.Marshal(m)
	must(t, os.WriteFile(c.home.configFile(), tampered, 0o600))
	if _, err := Open(ctx, Options{Home: home}); !errors.Is(err, errdefs.ErrCorrupt) || !strings.Contains(err.Error(), "content IDs") {
		t.Errorf("open with a plain-ID config over a keyed store: %v, want ErrCorrupt naming the scheme", err)
	}
	must(t, os.WriteFile(c.home.configFile(), cfg, 0o600))
	openEngine(t, home) // removes its sandboxes at cleanup
}

// On a keyed home the tracker's scans, frozen layers (built from the live
// upper, verified chunk by chunk), stacked and materialised branches, and
// a rollback by diff all work under the keyed scheme: every head equals a
// full read, every branch scans to its checkpoint, and everything verifies.
func TestKeyedIDsTrackFreezeRollback(t *testing.T) {
	ctx := context.Background()
	e := openTracking(t, filepath.Join(t.TempDir(), "home"))
	_, err := e.HomeSetup().Setup(ctx, SetupOptions{KeyFile: keyFile(t)})
	must(t, err)
	if !e.keys.IDs().Keyed() {
		t.Fatal("the home's IDs are not keyed")
	}
	cr, err := e.CreateSandbox(ctx, "s", CreateOptions{Base: richBase(t)})
	must(t, err)
	layerTurn(t, cr.Root)
	c1, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	checkAgainstFullRead(t, e, "s", c1, "first turn")
	want := mergedState(t, cr.Root)
	branchTurn(t, cr.Root, "t2")
	settle()
	c2, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	checkAgainstFullRead(t, e, "s", c2, "second turn")
	write(t, filepath.Join(cr.Root, "tracked/one"), "a plain new file\n")
	settle()
	c3, err := e.Checkpoint(ctx, "s", CheckpointOptions{})
	must(t, err)
	checkAgainstFullRead(t, e, "s", c3, "third turn")
	head := mergedState(t, cr.Root)
	if st := e.TrackingStats(); st.TrackedScans == 0 {
		t.Fatalf("no turn was tracked: %+v", st)
	}
	e.WaitFreezes()
	cp3, err := e.resolveFor(ctx, "", mustRef(c3.ID.String()))
	must(t, err)
	if !overlayOf(e).Layers().Has(cp3.FSTree) {
		t.Fatal("no frozen layer for the head checkpoint")
	}
	for _, o := range []BranchOptions{{}, {Materialise: true}} {
		name := "stacked"
		if o.Materialise {
			name = "copied"
		}
		br, err := e.Branch(ctx, mustRef(c3.ID.String()), delta.SandboxName(name), o)
		must(t, err)
		if got := mergedState(t, br.Root); got != head {
			t.Fatalf("branch %s hashes to %s, want %s", name, got.Short(), head.Short())
		}
		if res := scanOf(t, e, name); res.Root != cp3.FSTree || res.StateKey != cp3.StateKey {
			t.Fatalf("branch %s scans to %s, its checkpoint is %s", name, res.Root.Short(), cp3.FSTree.Short())
		}
		if stacks := overlay.FrozenUser(e.home.sandboxDir(delta.SandboxName(name))) == overlayOf(e).Layers().Dir(cp3.FSTree); stacks == o.Materialise {
			t.Fatalf("branch %s: stacks on the frozen layer %v, materialised %v", name, stacks, o.Materialise)
		}
	}
	_, err = e.Rollback(ctx, "s", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if got := mergedState(t, cr.Root); got != want {
		t.Fatalf("after the rollback the root hashes to %s, want %s", got.Short(), want.Short())
	}
	checkAll(t, e)
}

// An encrypted home made before keyed IDs (its key object names no scheme,
// its config no "ids") keeps plain BLAKE3 IDs: it opens, checkpoints,
// verifies and restores with them, and is never switched.
func TestEncryptedHomeBeforeKeyedIDsKeepsPlainIDs(t *testing.T) {
	ctx := context.Background()
	kf := keyFile(t)
	m, err := keys.ReadKeyFile(kf)
	must(t, err)
	e := newEngine(t)
	must(t, upload.PutBytes(ctx, rawLocalOf(e), delta.KeyName(m.ID()), m.WrapKeys(delta.NewDataKeyPlainIDs())))
	_, err = e.HomeSetup().Setup(ctx, SetupOptions{KeyFile: kf})
	must(t, err)
	if e.config.Encryption.IDs != "" || e.keys.IDs().Keyed() || !e.keys.Encrypted() {
		t.Fatalf("an old-scheme store set up with scheme %q (keyed %v)", e.config.Encryption.IDs, e.keys.IDs().Keyed())
	}
	big := make([]byte, 300<<10)
	rand.Read(big)
	cr, err := e.CreateSandbox(ctx, "old", CreateOptions{Base: richBase(t)})
	must(t, err)
	write(t, filepath.Join(cr.Root, "big.bin"), string(big))
	cp, err := e.Checkpoint(ctx, "old", CheckpointOptions{})
	must(t, err)
	if !slices.Equal(fileChunks(t, e, cp.ID, "big.bin"), plainChunks(t, delta.IDs{}, big)) {
		t.Fatal("an encrypted home made before keyed IDs does not name chunks with plain BLAKE3")
	}
	home := string(e.home)
	must(t, e.Close())
	o := openEngine(t, home)
	if o.keys.IDs().Keyed() {
		t.Fatal("reopening switched the home to keyed IDs")
	}
	_, err = o.Verifier().Verify(ctx, mustRef(cp.ID.String()))
	must(t, err)
	br, err := o.Branch(ctx, mustRef(cp.ID.String()), "copy", BranchOptions{})
	must(t, err)
	if got, err := os.ReadFile(filepath.Join(br.Root, "big.bin")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("restored file: %d bytes, %v", len(got), err)
	}
}

// A plaintext local store needs keyed IDs (its pack names go to the
// bucket): a store made before them refuses --encrypt-local=false.
func TestPlainLocalNeedsKeyedIDs(t *testing.T) {
	ctx := context.Background()
	kf := keyFile(t)
	m, err := keys.ReadKeyFile(kf)
	must(t, err)
	e := newEngine(t)
	must(t, upload.PutBytes(ctx, rawLocalOf(e), delta.KeyName(m.ID()), m.WrapKeys(delta.NewDataKeyPlainIDs())))
	if _, err := e.HomeSetup().Setup(ctx, SetupOptions{KeyFile: kf, PlainLocal: true}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("--encrypt-local=false on a plain-ID store: %v, want ErrPrecondition", err)
	}
	if e.config.Encryption != nil {
		t.Fatal("the refused setup left the home encrypted")
	}
}

// rawLocalOf is e's local store beneath its sealing wrapper.
func rawLocalOf(e *Engine) upload.Store {
	l, _ := e.keys.Raw()
	return l
}
