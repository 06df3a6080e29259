package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/testenv"
)

// sqliteBase is busyboxBase plus Debian's sqlite3 and the libraries ldd
// names, at their own paths, so the dynamic binary runs in the container.
func sqliteBase(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("sqlite3")
	if err != nil {
		testenv.Missing(t, "sqlite3", "apt package sqlite3 (scripts/deps.d/35-sqlite.sh)")
	}
	root := busyboxBase(t)
	out, err := exec.Command("ldd", bin).Output()
	must(t, err)
	files := map[string]string{"/bin/sqlite3": bin}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			files[f[2]] = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			files[f[0]] = f[0]
		}
	}
	for dst, src := range files {
		data, err := os.ReadFile(src) // follows symlinks: the real library
		must(t, err)
		p := filepath.Join(root, dst)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, data, 0o755))
	}
	must(t, os.MkdirAll(filepath.Join(root, "data"), 0o755))
	return root
}

// sqliteWriter inserts one row per tick on one connection it keeps open:
// the counter lives in the shell's memory and the connection in sqlite3's,
// so both come back only through CRIU. Errors (SQLITE_READONLY_DBMOVED
// prints "attempt to write a readonly database") go to /data/err.
// synchronous=OFF keeps each insert short, so a dump rarely finds the
// database lock held.
// Reader and writer wait for each other's locks (.timeout) instead of
// failing with "database is locked": CI saw the reader lose that race.
const sqliteWriter = `i=0; { echo '.timeout 5000'; echo 'pragma synchronous=off;'; while :; do i=$((i+1)); echo "insert into t values($i);"; sleep 0.05; done; } | sqlite3 /data/app.db 2>>/data/err`

// A process holding an SQLite database open keeps writing after a
// rollback on overlay: the database, rewritten in place by the diff
// restore, keeps its inode, so the restored connection does not find its
// database "moved" (SQLITE_READONLY_DBMOVED) as it did when a rollback
// rebuilt the whole layer (TURNSNAP_OVERLAY_RESTORE=rebuild makes this
// test fail that way).
func TestSQLiteKeepsWritingAfterRollback(t *testing.T) {
	requireProcs(t)
	ctx := context.Background()
	e := newEngine(t)
	cr, err := e.CreateSandbox(ctx, "db", CreateOptions{Base: sqliteBase(t)})
	must(t, err)
	sh(t, e, "db", "sqlite3 /data/app.db 'create table t(i integer)'")
	_, err = e.Processes().Exec(ctx, "db", []string{"sh", "-c", sqliteWriter}, ExecOptions{Detach: true})
	must(t, err)
	rows := func() int {
		t.Helper()
		n, err := strconv.Atoi(sh(t, e, "db", "sqlite3 -cmd '.timeout 5000' /data/app.db 'select count(*) from t'"))
		must(t, err)
		return n
	}
	waitRows := func(min int) int {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			n := rows()
			if n >= min {
				return n
			}
			if time.Now().After(deadline) {
				errs, _ := os.ReadFile(filepath.Join(cr.Root, "data/err"))
				t.Fatalf("the writer stopped at %d rows (want %d); its errors: %s", n, min, errs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitRows(10)
	c1, err := e.Checkpoint(ctx, "db", CheckpointOptions{})
	must(t, err)
	st1, err := os.Stat(filepath.Join(cr.Root, "data/app.db"))
	must(t, err)
	atCut := rows()
	waitRows(atCut + 10) // the database moves on past the checkpoint
	r, err := e.Rollback(ctx, "db", mustRef(c1.ID.String()), RollbackOptions{})
	must(t, err)
	if !r.Processes {
		t.Fatal("the rollback did not restore the writer")
	}
	st2, err := os.Stat(filepath.Join(cr.Root, "data/app.db"))
	must(t, err)
	// Ino only: every overlay mount has a device number of its own.
	if a, b := st1.Sys().(*syscall.Stat_t).Ino, st2.Sys().(*syscall.Stat_t).Ino; a != b {
		t.Errorf("app.db has inode %d after the rollback, %d before", b, a)
	}
	back := rows()
	if back > atCut+10 {
		t.Fatalf("after the rollback the table has %d rows, the checkpoint had about %d", back, atCut)
	}
	waitRows(back + 10) // the restored connection writes on
	if errs, _ := os.ReadFile(filepath.Join(cr.Root, "data/err")); len(errs) > 0 {
		t.Fatalf("the writer reported errors after the rollback: %s", errs)
	}
}
