package monorepo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Write writes t into dir (created if absent) with workers writers (0: 8),
// then sets every directory's mtime, deepest first, since writing into a
// directory changes its own.
func (t *Tree) Write(ctx context.Context, dir string, workers int) error {
	if workers <= 0 {
		workers = 8
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range t.Dirs {
		if err := os.Mkdir(filepath.Join(dir, filepath.FromSlash(d)), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := writer{buf: make([]byte, 1<<20)}
			for i := range next {
				if err := w.write(dir, t, i); err != nil {
					errs <- fmt.Errorf("monorepo: %s: %w", t.Entries[i].Path, err)
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range t.Entries {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs // nil when no writer failed
	}
	if err != nil {
		return err
	}
	for i := len(t.Dirs) - 1; i >= -1; i-- {
		d := "."
		if i >= 0 {
			d = t.Dirs[i]
		}
		h := fnv.New64a()
		h.Write([]byte(d))
		mt := epoch.Add(-time.Duration(h.Sum64() % uint64(365*24*time.Hour)))
		if err := os.Chtimes(filepath.Join(dir, filepath.FromSlash(d)), mt, mt); err != nil {
			return err
		}
	}
	return nil
}

// writer is one writer's state: its buffer, reused for every file.
type writer struct {
	buf []byte
}

func (w *writer) write(root string, t *Tree, i int) error {
	e := &t.Entries[i]
	p := filepath.Join(root, filepath.FromSlash(e.Path))
	ts := []unix.Timespec{unix.NsecToTimespec(e.Mtime.UnixNano()), unix.NsecToTimespec(e.Mtime.UnixNano())}
	if e.Kind == Symlink {
		if err := os.Symlink(e.Target, p); err != nil {
			return err
		}
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = w.content(f, t, e)
	if err == nil {
		err = f.Chmod(os.FileMode(e.Mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0)
}

// content writes e's bytes to f, a megabyte at a time.
func (w *writer) content(f *os.File, t *Tree, e *Entry) error {
	switch e.Kind {
	case Text:
		_, err := f.Write(text(w.buf[:0], e.Seed, e.Size))
		return err
	case NearDup:
		orig := &t.Entries[e.Of]
		b := text(w.buf[:0], orig.Seed, orig.Size)
		if len(b) > 0 {
			// One line changed: a version bump, a regenerated constant.
			at := int(e.Seed % uint64(len(b)))
			copy(b[at:], fmt.Appendf(nil, "\n// rev %d\n", e.Seed%100000))
		}
		_, err := f.Write(b)
		return err
	case Random, Structured:
		var key [32]byte
		binary.LittleEndian.PutUint64(key[:], e.Seed)
		src := rand.NewChaCha8(key)
		rng := rand.New(rand.NewPCG(e.Seed, 2))
		for left := e.Size; left > 0; {
			n := min(left, int64(len(w.buf)))
			b := w.buf[:n]
			if e.Kind == Random {
				src.Read(b)
			} else {
				structured(b, rng, e.Size-left)
			}
			if _, err := f.Write(b); err != nil {
				return err
			}
			left -= n
		}
		return nil
	}
	return fmt.Errorf("kind %d has no content", e.Kind)
}

// vocabulary is what text is made of: identifiers and syntax of the
// languages a monorepo mixes. Its own copy per call keeps no package state.
func vocabulary() []string {
	return []string{"func", "return", "if", "err", "nil", "for", "range", "ctx", "string", "int", ":=", "=", "{", "}",
		"(", ")", "const", "let", "var", "import", "from", "export", "default", "class", "def", "self", "async",
		"await", "type", "struct", "interface", "map", "len", "append", "make", "new", "this", "props", "state",
		"config", "options", "handler", "request", "response", "client", "server", "logger", "value", "key",
		"items", "index", "result", "error", "fmt.Errorf(\"%w\",", "console.log(", "assert", "test", "expect",
		"true", "false", "null", "undefined", "=>", "->", "::", ";", ",", ".", "+", "-", "*", "/", "==", "!=",
		"&&", "||", "<", ">", "public", "private", "static", "void", "u64", "usize", "pub", "fn", "impl", "mut",
		"match", "Some", "None", "Ok", "Err", "unwrap", "#", "//", "TODO", "the", "a", "of", "to", "is"}
}

// text appends size bytes of source-like text made from seed to b.
func text(b []byte, seed uint64, size int64) []byte {
	if size == 0 {
		return b
	}
	words := vocabulary()
	rng := rand.New(rand.NewPCG(seed, 1))
	for int64(len(b)) < size {
		for range rng.IntN(4) {
			b = append(b, '\t')
		}
		for range 2 + rng.IntN(10) {
			if rng.IntN(8) == 0 {
				b = fmt.Appendf(b, "v%d ", rng.IntN(100000))
				continue
			}
			b = append(b, words[rng.IntN(len(words))]...)
			b = append(b, ' ')
		}
		b = append(b, '\n')
	}
	return b[:size]
}

// structured fills b with 64-byte records from offset off on: a record
// number, a few random bytes and fields from a small vocabulary, so it
// compresses about 3x, as databases and build caches do.
func structured(b []byte, rng *rand.Rand, off int64) {
	words := vocabulary()
	var rec [64]byte
	for i := 0; i < len(b); i += len(rec) {
		n := (off + int64(i)) / int64(len(rec))
		r := fmt.Appendf(rec[:0], "%08x|", n)
		r = binary.LittleEndian.AppendUint64(r, rng.Uint64())
		for len(r) < len(rec) {
			r = append(r, words[rng.IntN(16)]...)
			r = append(r, '|')
		}
		copy(b[i:], r[:len(rec)])
	}
}

// EditSources is an agent's edit turn on a root holding the tree: it
// rewrites n of the tree's source files (different ones for each turn,
// spread over the tree by a stride prime to any count of sources) with
// about 2 KiB of new text that names the turn.
func (t *Tree) EditSources(root string, turn, n int) error {
	if len(t.Sources) == 0 {
		return fmt.Errorf("monorepo: the tree has no source files to edit")
	}
	body := strings.Repeat("x := compute(y)\n", 128)
	for i := range n {
		e := t.Entries[t.Sources[((turn*n+i)*7919)%len(t.Sources)]]
		data := fmt.Appendf(nil, "// turn %d edit %d\n%s", turn, i, body)
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(e.Path)), data, 0o644); err != nil {
			return fmt.Errorf("monorepo: edit turn %d: %w", turn, err)
		}
	}
	return nil
}
