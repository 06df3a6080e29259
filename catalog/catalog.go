package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Options configures Open. The zero value works.
type Options struct {
	// Logger receives the catalog's log lines, and Badger's at Warn and
	// above. Nil means slog.Default().
	Logger *slog.Logger
	// EncryptionKey, if set (32 bytes), makes Badger encrypt every file of
	// the catalog with AES-256 (its own at-rest encryption), so a stolen
	// disk shows no blob ID, record or sandbox name. A catalog is created
	// encrypted or not; opening it the other way is an error.
	EncryptionKey []byte
	// ReadOnly opens the catalog without writing anything to its directory
	// (Badger's read-only mode: no new memtable, no compaction), so reads
	// work on a full or read-only filesystem. Update fails.
	ReadOnly bool
}

// Catalog is an open catalog directory. It is safe for concurrent use by the
// goroutines of one process; only one process may have a directory open.
type Catalog struct {
	dir      string
	db       *badger.DB
	lock     *dirLock
	log      *slog.Logger
	readOnly bool
	records  recordCache
	// writers makes a retried Update exclusive: a first attempt runs
	// beside the others (shared), and one that conflicted runs again with
	// no other Update in flight (see Update).
	writers sync.RWMutex
	// updates counts committed Update transactions (Updates).
	updates atomic.Int64
	// written approximates the bytes this process has put into Badger's
	// memtable (Reserve): keys, values and a per-entry overhead.
	written atomic.Int64
}

// memTableSize is Badger's memtable size. Its write-ahead log file is
// twice that, and Open allocates it (preallocateMemtables).
const memTableSize = 16 << 20

// entryOverhead is what one write adds to a memtable beyond its key and
// value (skiplist node, version, WAL header): generous on purpose.
const entryOverhead = 128

// OpenReserve is the free space a writable Open needs on the catalog's
// filesystem: the write-ahead log it allocates (2 * memTableSize) and
// then Reserve's. A command that writes checks it before opening.
const OpenReserve = 2*memTableSize + memTableSize

// Reserve is the free space the open catalog may still take on its
// filesystem in this process, beyond the files it already holds, through
// Badger's mmapped writes (where a page fault with no block to give is a
// SIGBUS, not an error): its memtable flushed into a table (at Close, or
// when it fills), and, once this process has written enough that the
// memtable may fill, the next memtable's write-ahead log, which Badger
// creates sparse (2 * memTableSize). The WAL Open allocated is held
// already (Held), so it is not counted again: counting it made a 10 MiB
// turn with 86 MiB free fail (issue 24).
func (c *Catalog) Reserve() uint64 {
	r := uint64(memTableSize)
	if c.written.Load() >= memTableSize/4 {
		r += 2 * memTableSize
	}
	return r
}

// Held is what the catalog's write-ahead log files take on disk now: the
// space Open allocated, which Close gives back once their memtables are
// flushed into tables (so df, run after the command, counts it free).
func (c *Catalog) Held() uint64 {
	mems, _ := filepath.Glob(filepath.Join(c.dir, "*.mem"))
	var n uint64
	for _, m := range mems {
		var st unix.Stat_t
		if unix.Stat(m, &st) == nil {
			n += uint64(st.Blocks) * 512
		}
	}
	return n
}

// badgerOptions tunes Badger for a CLI: each command opens the catalog, does a
// few small transactions and exits, and the whole index is at most a few
// hundred MB. Badger's defaults are for a long-running server holding a large
// database and cost that at every open (memory) and every crash (lost writes).
func badgerOptions(dir string, log *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		// A checkpoint is reported done only after its catalog entry is on
		// disk; without this a crash after "checkpoint created" could lose it.
		// One fsync per transaction is cheap next to the upload before it.
		WithSyncWrites(true).
		// Each memtable's arena is allocated at full size, and its
		// write-ahead log file is created at twice that size: the 64 MiB
		// default means a 128 MiB .mem file for a catalog of a few KB.
		// 16 MiB holds far more than one command ever writes.
		WithMemTableSize(memTableSize).
		WithNumMemtables(2).
		// Value log files are preallocated and mmapped at this size; the 1 GiB
		// default would make a fresh catalog look huge and map a lot for
		// nothing. Our values are small and stay inline in the LSM tree
		// anyway (default ValueThreshold), so the vlog barely grows.
		WithValueLogFileSize(64 << 20).
		// Caches only pay off across many reads in a long-lived process; a
		// command touches a handful of blocks. Snappy block compression (the
		// default) needs a non-zero block cache.
		WithBlockCacheSize(8 << 20).
		WithIndexCacheSize(4 << 20).
		// Every key has one meaningful version; keeping older ones only
		// delays reclaiming space after deletes and overwrites.
		WithNumVersionsToKeep(1).
		// Fewer background compactors: the database is small and each command
		// is short; two is Badger's minimum for L0 to keep up.
		WithNumCompactors(2).
		// Badger's metrics are process-global expvars nobody reads in a CLI.
		WithMetricsEnabled(false).
		WithLogger(newBadgerLogger(log, dir))
}

// truncateNeeded reports Badger's "Log truncate required": some of Badger's
// wrappers format the cause into text, so errors.Is alone misses it.
func truncateNeeded(err error) bool {
	return err != nil && (errors.Is(err, badger.ErrTruncateNeeded) ||
		strings.Contains(err.Error(), badger.ErrTruncateNeeded.Error()))
}

// emptyLogs lists the zero-length write-ahead (NNNNN.mem) and value log
// (NNNNNN.vlog) files in dir. Badger creates both kinds empty and only then
// sizes them, and retires both by truncating them to zero and then unlinking
// them (a flushed memtable, a spent value log), so a process killed between
// the two steps leaves an empty file behind. Badger refuses to open a
// directory holding one: read-only it cannot size the file ("truncate:
// invalid argument"), and writably it sizes it and then fails on its own
// "Create a new file" signal, so the first writer after the kill failed too.
// An empty log holds nothing: no committed entry and no value pointer can
// refer to it, so removing it loses nothing.
func emptyLogs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var empty []string
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !(strings.HasSuffix(name, ".mem") || strings.HasSuffix(name, ".vlog")) {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Size() == 0 {
			empty = append(empty, name)
		}
	}
	return empty, nil
}

// removeEmptyLogs removes the empty logs emptyLogs found. Callers hold the
// catalog's exclusive lock, so no turnsnap is creating one of them right now;
// Badger's own lock on the directory, held meanwhile, keeps off a foreign
// Badger (the badger CLI) whose new memtable is empty for an instant.
func removeEmptyLogs(dir string, names []string, log *slog.Logger) error {
	if len(names) == 0 {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close() // releases the flock before Badger takes its own
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return inUse(dir, errors.New("the directory lock of Badger is held"))
	} else if err != nil {
		return fmt.Errorf("catalog %s: lock: %w", dir, err)
	}
	for _, name := range names {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove the empty %s a killed process left: %w", name, err)
		}
		log.Info("catalog: removed an empty log file a killed process left", "dir", dir, "file", name)
	}
	return nil
}

// openBadger opens Badger with bo after repairing what a process killed
// inside Badger's own open or close can leave: empty logs (emptyLogs), and a
// write-ahead log longer than its entries, which Badger trims only writably
// (truncateNeeded). A read-only open that meets either recovers through one
// short writable open (recoverThenReadOnly).
func openBadger(dir string, log *slog.Logger, key []byte, bo badger.Options) (*badger.DB, error) {
	empty, err := emptyLogs(dir)
	if err != nil {
		return nil, err
	}
	if !bo.ReadOnly {
		if err := removeEmptyLogs(dir, empty, log); err != nil {
			return nil, err
		}
		return badger.Open(bo)
	}
	if len(empty) == 0 {
		db, err := badger.Open(bo)
		if !truncateNeeded(err) {
			return db, err
		}
	}
	// We hold the catalog's exclusive lock, so no writer can be there:
	// recover once, writably, then read. On a full or read-only filesystem
	// that fails and says so.
	return recoverThenReadOnly(dir, log, key, empty, bo)
}

// recoverThenReadOnly removes the empty logs and opens the catalog in dir
// writably, so Badger trims and flushes a killed writer's memtables, closes
// it, and opens it again read-only (bo).
func recoverThenReadOnly(dir string, log *slog.Logger, key []byte, empty []string, bo badger.Options) (*badger.DB, error) {
	rw := badgerOptions(dir, log)
	if key != nil {
		rw = rw.WithEncryptionKey(key).WithIndexCacheSize(16 << 20)
	}
	const needs = "the catalog needs crash recovery after a killed writer, which writes to its directory"
	if err := removeEmptyLogs(dir, empty, log); errors.Is(err, errdefs.ErrUnavailable) {
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", needs, noSpace(err))
	}
	db, err := badger.Open(rw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", needs, noSpace(err))
	}
	if err := db.Close(); err != nil {
		return nil, fmt.Errorf("recover the catalog after a killed writer: %w", noSpace(err))
	}
	log.Info("catalog recovered after a killed writer", "dir", dir)
	return badger.Open(bo)
}

// damaged wraps an error Badger gave opening the catalog in dir that no
// crash recovery explains (a bad MANIFEST checksum, a missing table, a
// corrupt table): errdefs.ErrCorrupt, with the way out. Errors of the
// environment (permissions, a read-only filesystem, a wrong key, I/O
// errors) and a canceled open pass through as they are.
func damaged(dir string, err error) error {
	environment := errors.Is(err, errdefs.ErrNoSpace) || errors.Is(err, context.Canceled) ||
		strings.Contains(err.Error(), badger.ErrEncryptionKeyMismatch.Error()) ||
		strings.Contains(err.Error(), badger.ErrInvalidEncryptionKey.Error())
	for _, errno := range []unix.Errno{unix.EACCES, unix.EPERM, unix.EROFS, unix.EIO, unix.ENOENT,
		unix.EMFILE, unix.ENFILE, unix.ENOMEM} {
		// Badger's y.Wrapf formats its causes into text, dropping the errno.
		environment = environment || errors.Is(err, errno) || strings.Contains(err.Error(), errno.Error())
	}
	if environment {
		return fmt.Errorf("open catalog %s: %w", dir, err)
	}
	return fmt.Errorf("catalog %s is damaged (%v); it is an index of the store: move the directory aside "+
		"and run `turnsnap catalog rebuild` to recreate it from the store: %w", dir, err, errdefs.ErrCorrupt)
}

// Open opens (creating if needed) the catalog in dir. A directory held by
// another process fails with errdefs.ErrUnavailable; a catalog written with a
// schema this turnsnap does not know fails with errdefs.ErrPrecondition.
func Open(ctx context.Context, dir string, opts Options) (*Catalog, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open catalog %s: %w", dir, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if !opts.ReadOnly {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open catalog %s: %w", dir, err)
		}
	} else if _, err := os.Stat(filepath.Join(dir, "MANIFEST")); err != nil {
		return nil, fmt.Errorf("open catalog %s read-only: %w", dir, err)
	}
	lock, err := lockDir(dir, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	bo := badgerOptions(dir, log).WithReadOnly(opts.ReadOnly)
	if opts.EncryptionKey != nil {
		// Badger requires a block index cache with encryption; 16 MiB
		// holds the index of a catalog of a few hundred MB.
		bo = bo.WithEncryptionKey(opts.EncryptionKey).WithIndexCacheSize(16 << 20)
	}
	// A writer killed mid-session leaves its write-ahead memtable longer
	// than its entries (we preallocate it), and one killed inside Badger's
	// open or close can leave empty logs; openBadger repairs both.
	db, err := openBadger(dir, log, opts.EncryptionKey, bo)
	if err != nil {
		_ = lock.unlock()
		if isBadgerLockErr(err) {
			return nil, inUse(dir, err)
		}
		if errors.Is(err, errdefs.ErrUnavailable) {
			return nil, err
		}
		return nil, damaged(dir, noSpace(err))
	}
	c := &Catalog{dir: dir, db: db, lock: lock, log: log, readOnly: opts.ReadOnly}
	if opts.ReadOnly {
		return c, c.checkSchemaRO(ctx)
	}
	// Badger writes its write-ahead log through a sparse mmapped file; on a
	// full filesystem the page fault is a SIGBUS that kills the process.
	// Allocating the file's blocks now turns that into ENOSPC, here.
	if err := preallocateMemtables(dir); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("open catalog %s: %w", dir, err)
	}
	if err := c.checkSchema(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// preallocateMemtables allocates every block of Badger's memtable files.
func preallocateMemtables(dir string) error {
	mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	for _, m := range mems {
		// Badger may be deleting a replayed memtable meanwhile (its flush
		// truncates the file to 0, then removes it): a file gone or empty
		// has nothing to allocate (fallocate of length 0 is EINVAL).
		f, err := os.OpenFile(m, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue // flushed and removed by Badger since the Glob
		}
		if err != nil {
			return err
		}
		st, err := f.Stat()
		// Badger retires a flushed memtable by truncating it to 0 and then
		// removing it, in the background: an empty one is on its way out,
		// has nothing to allocate, and fallocate of length 0 is EINVAL.
		if err == nil && st.Size() > 0 {
			err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, st.Size())
		}
		f.Close()
		if err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("allocate %s: %w", m, noSpace(err))
		}
	}
	return nil
}

// noSpace classes a full filesystem as errdefs.ErrNoSpace.
func noSpace(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) ||
		strings.Contains(err.Error(), "no space left on device") { // Badger's y.Wrapf drops the errno
		return fmt.Errorf("%v: %w", err, errdefs.ErrNoSpace)
	}
	return err
}

// checkSchemaRO is checkSchema for a read-only catalog: it can refuse a
// schema it does not know but cannot write one.
func (c *Catalog) checkSchemaRO(ctx context.Context) error {
	err := c.View(ctx, func(tx *Tx) error {
		version, found, err := c.readSchema(tx)
		if err == nil && !found {
			err = fmt.Errorf("catalog %s: read schema version: %w", c.dir, badger.ErrKeyNotFound)
		}
		if err != nil {
			return err
		}
		return c.knownSchema(version)
	})
	if err != nil {
		_ = c.Close()
	}
	return err
}

// checkSchema writes the schema version into a new catalog and refuses one
// whose version this code does not know: reading keys laid out differently
// would return wrong answers, and a rebuild from the store is always possible.
func (c *Catalog) checkSchema(ctx context.Context) error {
	return c.Update(ctx, func(tx *Tx) error {
		version, found, err := c.readSchema(tx)
		if err != nil {
			return err
		}
		if !found {
			if !tx.isEmpty() {
				return fmt.Errorf("catalog %s has data but no schema version (not a turnsnap catalog?): %w",
					c.dir, errdefs.ErrPrecondition)
			}
			v, _ := json.Marshal(SchemaVersion)
			return tx.set(schemaKey(), v, "schema version")
		}
		return c.knownSchema(version)
	})
}

// readSchema reads the catalog's schema version; found is false when the
// catalog has none (a new one).
func (c *Catalog) readSchema(tx *Tx) (version int, found bool, err error) {
	item, err := tx.txn.Get(schemaKey())
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("catalog %s: read schema version: %w", c.dir, err)
	}
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &version) }); err != nil {
		return 0, false, fmt.Errorf("catalog %s: schema version: %v: %w", c.dir, err, errdefs.ErrCorrupt)
	}
	return version, true, nil
}

// knownSchema refuses a schema version this code does not read.
func (c *Catalog) knownSchema(version int) error {
	if version != SchemaVersion {
		return fmt.Errorf("catalog %s has schema version %d, this turnsnap reads version %d "+
			"(upgrade turnsnap, or move the directory aside and rebuild it from the store): %w",
			c.dir, version, SchemaVersion, errdefs.ErrPrecondition)
	}
	return nil
}

// Dir returns the directory the catalog was opened in.
func (c *Catalog) Dir() string { return c.dir }

// Updates is how many Update transactions have committed, each one fsync
// (tests and benchmarks count a checkpoint's).
func (c *Catalog) Updates() int64 { return c.updates.Load() }

// Close flushes and closes the database and releases the directory lock.
// Calling it again does nothing.
func (c *Catalog) Close() error {
	if c.db == nil {
		return nil
	}
	err := c.db.Close()
	if uerr := c.lock.unlock(); err == nil {
		err = uerr
	}
	c.db = nil
	if err != nil {
		return fmt.Errorf("close catalog %s: %w", c.dir, err)
	}
	return nil
}

// ready is checked before any work: a canceled ctx starts nothing, and a
// closed catalog is an error rather than a nil dereference.
func (c *Catalog) ready(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("catalog %s: %w", c.dir, err)
	}
	if c.db == nil {
		return fmt.Errorf("catalog %s is closed: %w", c.dir, errdefs.ErrPrecondition)
	}
	return nil
}

// View runs fn in a read-only transaction that sees one consistent snapshot.
// The Tx is valid only until fn returns.
func (c *Catalog) View(ctx context.Context, fn func(tx *Tx) error) error {
	if err := c.ready(ctx); err != nil {
		return err
	}
	return c.db.View(func(txn *badger.Txn) error {
		return fn(&Tx{ctx: ctx, txn: txn, records: &c.records})
	})
}

// maxUpdateAttempts bounds the attempts of a conflicting transaction. Only
// the first runs beside other Updates; the rest run exclusively, where only
// a write batch (PutBlobs) committing meanwhile can conflict with them.
const maxUpdateAttempts = 5

// Update runs fn in a read-write transaction and commits it if fn returns nil
// (durably: the catalog syncs every commit). When the commit conflicts with a
// concurrent Update, fn runs again on a fresh snapshot, so fn must have no
// effects outside tx, or ones that are safe to repeat, and must not call
// Update itself.
//
// Why the retries are exclusive: Badger's transactions are optimistic, and
// writers that touch the same keys (sandboxes created from one base all add
// to its refcounts; the pusher dequeues beside the commits) conflict. With
// optimistic retries alone, 32 sandboxes created at once starved some
// writers through every attempt (TestUpdateUnderContention); an exclusive
// retry cannot lose to another Update, so every writer gets through.
func (c *Catalog) Update(ctx context.Context, fn func(tx *Tx) error) error {
	if c.readOnly {
		return fmt.Errorf("catalog %s is open read-only: %w", c.dir, errdefs.ErrPrecondition)
	}
	var err error
	for attempt := 0; attempt < maxUpdateAttempts; attempt++ {
		if err := c.ready(ctx); err != nil {
			return err
		}
		if attempt == 0 {
			c.writers.RLock()
		} else {
			c.writers.Lock()
		}
		err = c.db.Update(func(txn *badger.Txn) error {
			return fn(&Tx{ctx: ctx, txn: txn, records: &c.records, written: &c.written})
		})
		if attempt == 0 {
			c.writers.RUnlock()
		} else {
			c.writers.Unlock()
		}
		if !errors.Is(err, badger.ErrConflict) {
			break
		}
		c.log.Debug("catalog transaction conflict, retrying", "catalog", c.dir, "attempt", attempt+1)
		if attempt == 0 {
			continue // the exclusive attempt needs no back-off
		}
		// An exclusive attempt lost to a write batch: let it finish.
		select {
		case <-ctx.Done():
			return fmt.Errorf("catalog %s: %w", c.dir, ctx.Err())
		case <-time.After(time.Millisecond << attempt):
		}
	}
	switch {
	case err == nil:
		c.updates.Add(1)
		return nil
	case errors.Is(err, badger.ErrConflict):
		return fmt.Errorf("catalog %s: transaction still conflicting after %d attempts: %w",
			c.dir, maxUpdateAttempts, errdefs.ErrUnavailable)
	case errors.Is(err, badger.ErrTxnTooBig):
		return fmt.Errorf("catalog %s: transaction too big (use PutBlobs/AddRefCounts for bulk writes): %w", c.dir, err)
	}
	return noSpace(err)
}
