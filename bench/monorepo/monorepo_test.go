package monorepo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// digest hashes every path, type, mode, mtime, size, link target and
// content below dir (directories included), in walk order.
func digest(t *testing.T, dir string) [32]byte {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v %d %d\n", rel, info.Mode(), info.ModTime().UnixNano(), info.Size())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Write([]byte(target))
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// TestGenerateIsDeterministic writes one small tree with 1 writer and with
// 16: the two must be equal to the byte, the mtime and the mode, and a
// different seed must give a different tree.
func TestGenerateIsDeterministic(t *testing.T) {
	ctx := context.Background()
	o := Options{Seed: 7, Files: 600, Bytes: 3 << 20}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	for i, w := range []int{1, 16} {
		o.Workers = w
		if _, err := Generate(ctx, dirs[i], o); err != nil {
			t.Fatal(err)
		}
	}
	if digest(t, dirs[0]) != digest(t, dirs[1]) {
		t.Fatal("1 writer and 16 writers wrote different trees from one seed")
	}
	o.Seed = 8
	if _, err := Generate(ctx, dirs[2], o); err != nil {
		t.Fatal(err)
	}
	if digest(t, dirs[0]) == digest(t, dirs[2]) {
		t.Fatal("seeds 7 and 8 wrote the same tree")
	}
}

// TestPlanShape holds the full-size plan to the figures (150,000
// entries, 1.4 GiB within 1%) and the mix the benchmarks rely on: large
// binaries, a .git with a pack and refs, deep vendored directories, near
// duplicates, symlinks and modes other than 0644.
func TestPlanShape(t *testing.T) {
	tr, err := Plan(Options{Seed: 1, Files: FullFiles, Bytes: FullBytes})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tr.Entries); n != FullFiles {
		t.Errorf("%d entries, want %d", n, FullFiles)
	}
	if d := float64(tr.Bytes-FullBytes) / FullBytes; d > 0.01 || d < -0.01 {
		t.Errorf("%d bytes, want %d within 1%%", tr.Bytes, FullBytes)
	}
	var big, links, dups, modes, pack, refs, deep int
	var sum int64
	for _, e := range tr.Entries {
		sum += e.Size
		switch {
		case e.Size >= 10<<20:
			big++
		case e.Kind == Symlink:
			links++
		case e.Kind == NearDup:
			dups++
		}
		if e.Mode != 0o644 && e.Kind != Symlink {
			modes++
		}
		if strings.HasPrefix(e.Path, ".git/objects/pack/") {
			pack++
		}
		if strings.HasPrefix(e.Path, ".git/refs/") {
			refs++
		}
		if strings.Count(e.Path, "/") >= 6 && strings.HasPrefix(e.Path, "third_party/") {
			deep++
		}
	}
	if sum != tr.Bytes {
		t.Errorf("entries sum to %d bytes, the tree says %d", sum, tr.Bytes)
	}
	for what, n := range map[string]int{"files of 10 MiB or more": big, "symlinks": links, "near duplicates": dups,
		"modes other than 0644": modes, "pack files": pack, "refs": refs, "vendored files 6 deep": deep} {
		if n == 0 {
			t.Errorf("no %s", what)
		}
	}
	if big < 3 || big > 8 {
		t.Errorf("%d large binaries, want a few", big)
	}
	if len(tr.Sources) < FullFiles/4 {
		t.Errorf("%d source files an agent can edit", len(tr.Sources))
	}
}

// TestContentCompresses checks the kinds' contents are what they claim:
// text and structured compress at least 2x with zstd, random does not.
func TestContentCompresses(t *testing.T) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	w := writer{buf: make([]byte, 1<<20)}
	for _, k := range []Kind{Text, Structured, Random} {
		tr := &Tree{Entries: []Entry{{Path: "x", Kind: k, Size: 1 << 20, Seed: 3, Mode: 0o644}}}
		var buf bytes.Buffer
		f, err := os.Create(filepath.Join(t.TempDir(), "x"))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.content(f, tr, &tr.Entries[0]); err != nil {
			t.Fatal(err)
		}
		f.Close()
		data, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(enc.EncodeAll(data, nil))
		ratio := float64(len(data)) / float64(buf.Len())
		if len(data) != 1<<20 {
			t.Errorf("kind %d: %d bytes written, want %d", k, len(data), 1<<20)
		}
		if (k == Random) != (ratio < 1.1) || (k != Random && ratio < 2) {
			t.Errorf("kind %d compresses %.2fx", k, ratio)
		}
	}
}

// EditSources rewrites n distinct source files a turn, others each turn,
// and nothing else.
func TestEditSources(t *testing.T) {
	dir := t.TempDir()
	tr, err := Generate(context.Background(), dir, Options{Seed: 3, Files: 600, Bytes: 3 << 20})
	if err != nil {
		t.Fatal(err)
	}
	before := digest(t, dir)
	edited := func(turn int) map[string]bool {
		if err := tr.EditSources(dir, turn, 10); err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, ix := range tr.Sources {
			p := tr.Entries[ix].Path
			data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.HasPrefix(data, fmt.Appendf(nil, "// turn %d edit ", turn)) {
				out[p] = true
			}
		}
		return out
	}
	a, b := edited(1), edited(2)
	if len(a) != 10 || len(b) != 10 {
		t.Fatalf("turns edited %d and %d files, want 10 each", len(a), len(b))
	}
	for p := range b {
		if a[p] {
			t.Errorf("%s edited by both turns", p)
		}
	}
	if digest(t, dir) == before {
		t.Error("the tree's digest did not change")
	}
}
