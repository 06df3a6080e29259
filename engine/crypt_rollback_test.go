package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// On an encrypted home a rollback by diff reads its chunks through the
// sealed store (opened and hash-checked) and keeps the inodes of files in
// both states, as on a plaintext one.
func TestEncryptedRollbackKeepsInodes(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	_, err := e.HomeSetup().Setup(ctx, SetupOptions{KeyFile: keyFile(t)})
	must(t, err)
	if e.data.repo.Keys() == nil {
		t.Fatal("the home is not encrypted")
	}
	base := t.TempDir()
	write(t, filepath.Join(base, "etc/config"), "port=1\n")
	cr, err := e.CreateSandbox(ctx, "c", CreateOptions{Base: base})
	must(t, err)
	db, conf := filepath.Join(cr.Root, "data/app.db"), filepath.Join(cr.Root, "etc/config")
	write(t, db, "version 1\n")
	write(t, conf, "port=2\n")
	settle()
	c1, err := e.Checkpoint(ctx, "c", CheckpointOptions{})
	must(t, err)
	want := mergedState(t, cr.Root)
	inoDB, inoConf := inode(t, db), inode(t, conf)
	rewrite(t, db, "version 2: the turn to undo\n")
	rewrite(t, conf, "port=3\n")
	write(t, filepath.Join(cr.Root, "data/extra"), "new\n")
	settle()
	_, err = e.Checkpoint(ctx, "c", CheckpointOptions{})
	must(t, err)
	_, err = e.Rollback(ctx, "c", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if got := mergedState(t, cr.Root); got != want {
		t.Fatalf("after the rollback the root hashes to %s, want %s", got.Short(), want.Short())
	}
	if data, _ := os.ReadFile(db); string(data) != "version 1\n" {
		t.Fatalf("app.db after the rollback: %q", data)
	}
	if inode(t, db) != inoDB || inode(t, conf) != inoConf {
		t.Fatalf("inodes after the rollback: app.db %d (had %d), config %d (had %d)", inode(t, db), inoDB, inode(t, conf), inoConf)
	}
}
