package fstree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recordingSaver records every SaveBlob call in order, and counts
// PrepareBlob calls (made on the pipeline's workers).
type recordingSaver struct {
	calls    []string
	prepared atomic.Int64
	failAt   int // fail the failAt-th SaveBlob (1-based); 0: never
}

func (r *recordingSaver) SaveBlob(_ context.Context, t delta.BlobType, id delta.ID, data []byte) (bool, error) {
	r.calls = append(r.calls, fmt.Sprintf("%s %s %d", t, id, len(data)))
	if delta.Hash(data) != id {
		return false, fmt.Errorf("blob %s: data does not hash to its id", id.Short())
	}
	if r.failAt > 0 && len(r.calls) == r.failAt {
		return false, errors.New("store is full")
	}
	return true, nil
}

func (r *recordingSaver) PrepareBlob(_ context.Context, t delta.BlobType, id delta.ID, plain []byte) {
	r.prepared.Add(1)
}

// writeMixed writes n files spread over directories: random bytes and
// source-like text, sizes from a few bytes to a few MiB, some repeated.
func writeMixed(t testing.TB, dir string, seed int64, n int, maxSize int) int64 {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	var total int64
	for i := range n {
		d := filepath.Join(dir, fmt.Sprintf("d%d", i%5), fmt.Sprintf("e%d", i%3))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		size := rng.Intn(maxSize)
		if i%4 == 0 {
			size = rng.Intn(100)
		}
		data := make([]byte, size)
		if i%2 == 0 {
			rng.Read(data)
		} else {
			textLike(rng, data)
		}
		if i%7 == 3 && i > 0 {
			data, _ = os.ReadFile(filepath.Join(dir, "d0", "e0", "f0")) // a duplicate
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		total += int64(len(data))
	}
	return total
}

// textLike fills b with source-like text: words repeat, so it compresses
// about as well as code.
func textLike(rng *rand.Rand, b []byte) {
	words := []string{"func", "return", "err", "nil", "ctx", "if", "for", "range", "{", "}", ":=", "string", "\n\t", "//", "type", "struct"}
	i := 0
	for i < len(b) {
		i += copy(b[i:], words[rng.Intn(len(words))])
		if i < len(b) {
			b[i] = ' '
			i++
		}
	}
}

// TestPipelineSavesInSerialOrder: a scan through the pipeline makes
// exactly the SaveBlob calls of the single-worker scan, in the same order,
// so trees, IDs and packs are byte-identical; and it really ran on workers.
func TestPipelineSavesInSerialOrder(t *testing.T) {
	dir := t.TempDir()
	writeMixed(t, dir, 1, 60, 600<<10)
	ctx := context.Background()
	var roots []delta.ID
	var calls [][]string
	for _, workers := range []int{1, 2, 4} {
		rec := &recordingSaver{}
		res, err := Scan(ctx, dir, ScanOptions{Saver: rec, Workers: workers})
		must(t, err)
		if workers == 1 && rec.prepared.Load() != 0 {
			t.Fatalf("one worker prepared %d blobs: the pipeline ran", rec.prepared.Load())
		}
		if workers > 1 && rec.prepared.Load() == 0 {
			t.Fatalf("%d workers prepared nothing: the pipeline did not run", workers)
		}
		roots = append(roots, res.Root)
		calls = append(calls, rec.calls)
	}
	// A hash-only scan (a restore's verification) pipelines too.
	hashOnly, err := Scan(ctx, dir, ScanOptions{Workers: 4})
	must(t, err)
	if hashOnly.Root != roots[0] {
		t.Fatalf("hash-only root %s differs from the serial root %s", hashOnly.Root.Short(), roots[0].Short())
	}
	for i := 1; i < len(roots); i++ {
		if roots[i] != roots[0] {
			t.Fatalf("root %s differs from the serial root %s", roots[i].Short(), roots[0].Short())
		}
		if len(calls[i]) != len(calls[0]) {
			t.Fatalf("%d saves, serial made %d", len(calls[i]), len(calls[0]))
		}
		for j := range calls[0] {
			if calls[i][j] != calls[0][j] {
				t.Fatalf("save %d: %s, serial saved %s", j, calls[i][j], calls[0][j])
			}
		}
	}
}

// TestSmallScanStartsNoPipeline: a turn of ten small files stays on the
// scanning goroutine.
func TestSmallScanStartsNoPipeline(t *testing.T) {
	dir := t.TempDir()
	writeMixed(t, dir, 2, 10, 50<<10)
	rec := &recordingSaver{}
	before := runtime.NumGoroutine()
	_, err := Scan(context.Background(), dir, ScanOptions{Saver: rec, Workers: 8})
	must(t, err)
	if rec.prepared.Load() != 0 {
		t.Fatalf("a %d-file scan under the threshold prepared %d blobs", 10, rec.prepared.Load())
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("goroutines %d -> %d", before, after)
	}
}

// TestPipelineSaveErrorStopsScan: a save that fails midway fails the scan
// with the saver's error, and no pipeline goroutine is left behind.
func TestPipelineSaveErrorStopsScan(t *testing.T) {
	dir := t.TempDir()
	writeMixed(t, dir, 3, 40, 400<<10)
	before := runtime.NumGoroutine()
	for _, workers := range []int{1, 4} {
		rec := &recordingSaver{failAt: 30}
		_, err := Scan(context.Background(), dir, ScanOptions{Saver: rec, Workers: workers})
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte("store is full")) {
			t.Fatalf("workers %d: got %v, want the saver's error", workers, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	_, err := Scan(ctx, dir, ScanOptions{Saver: &recordingSaver{}, Workers: 4, beforeOpen: func(string) {
		once.Do(cancel)
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled scan: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("goroutines %d -> %d: the pipeline leaked", before, after)
	}
}
