package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// With --encrypt-local=false a marker written into a sandbox file is in
// the local store (plaintext) but in no byte of the bucket; the bucket
// restores on a fresh home with the key, whether that home keeps its own
// store plaintext or encrypted; without the key it fails with ErrKey.
func TestPlainLocalSealedRemote(t *testing.T) {
	ctx := context.Background()
	srv := startMinIO(t)
	key := keyFile(t)
	rc := remoteCfg(srv.Endpoint, "halfsealed")

	a := newEngine(t)
	_, err := a.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: key, PlainLocal: true})
	must(t, err)
	if ec := a.config.Encryption; !ec.PlainLocal || ec.IDs != delta.SchemeKeyed {
		t.Fatalf("config after init --encrypt-local=false: %+v", ec)
	}
	cr, err := a.CreateSandbox(ctx, "half", CreateOptions{Base: richBase(t)})
	must(t, err)
	mark := newMarker("LOCAL")
	secret := incompressible(mark)
	write(t, filepath.Join(cr.Root, "secret.bin"), secret)
	cp, err := a.Checkpoint(ctx, "half", CheckpointOptions{})
	must(t, err)
	_, err = a.Remote().Push(ctx, PushOptions{})
	must(t, err)
	home := string(a.home)
	must(t, a.Close())
	if len(filesHolding(t, a.home.storeDir(), []byte(mark))) == 0 {
		t.Fatal("the plaintext local store does not show the marker: the bucket grep below proves nothing")
	}
	if got := filesHolding(t, srv.Dir, []byte(mark)); len(got) > 0 {
		t.Fatalf("marker in plaintext in the bucket: %v", got)
	}
	a = openEngine(t, home)
	_, err = a.Verifier().Verify(ctx, mustRef(cp.ID.String()))
	must(t, err)
	// The choice is made once: a plaintext local store is never sealed later.
	if _, err := a.HomeSetup().Setup(ctx, SetupOptions{KeyFile: key}); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("init --encrypt-local=true on a plaintext-local home: %v, want ErrPrecondition", err)
	}

	// Fresh homes with the key restore from the bucket: plaintext-local
	// (packs opened into the plaintext layout) and encrypted-local (packs
	// fetched sealed as they are).
	for _, plain := range []bool{true, false} {
		b := newEngine(t)
		_, err := b.HomeSetup().Setup(ctx, SetupOptions{Remote: &rc, KeyFile: key, PlainLocal: plain})
		must(t, err)
		rep, err := b.Rebuilder().RebuildCatalog(ctx)
		must(t, err)
		if rep.Checkpoints != 2 {
			t.Fatalf("plaintext-local %v: rebuild found %d checkpoints, want 2", plain, rep.Checkpoints)
		}
		_, err = b.Verifier().Verify(ctx, mustRef(cp.ID.String()))
		must(t, err)
		br, err := b.Branch(ctx, mustRef(cp.ID.String()), "copy", BranchOptions{})
		must(t, err)
		if got, err := os.ReadFile(filepath.Join(br.Root, "secret.bin")); err != nil || string(got) != secret {
			t.Fatalf("plaintext-local %v: restored file: %d bytes, %v", plain, len(got), err)
		}
		if has := len(filesHolding(t, b.home.storeDir(), []byte(mark))) > 0; has != plain {
			t.Errorf("plaintext-local %v: the fetched local store shows the marker: %v", plain, has)
		}
	}

	// Without the key a fresh home fails cleanly.
	c := newEngine(t)
	if _, err := c.HomeSetup().Init(ctx, rc); !errors.Is(err, errdefs.ErrKey) {
		t.Errorf("init of the bucket without a key: %v, want ErrKey", err)
	}
}
