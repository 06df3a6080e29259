package fstree

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"github.com/turnsnap/turnsnap/delta"
	"maps"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

func cacheEntry(n int) CacheEntry {
	return CacheEntry{Key: CacheKey{Ino: uint64(n), Size: int64(n)}, Entry: delta.Entry{Type: delta.TypeFile, Size: uint64(n)}}
}

func cacheOf(m map[string]CacheEntry) *ScanCache {
	c := NewScanCache()
	for k, e := range m {
		c.Put(k, e)
	}
	return c
}

// checkCache fails unless c holds exactly want, through every way in.
func checkCache(t *testing.T, what string, c *ScanCache, want map[string]CacheEntry, probes []string) {
	t.Helper()
	if !reflect.DeepEqual(c.flat(), want) {
		t.Fatalf("%s: holds %d entries, want %d", what, len(c.flat()), len(want))
	}
	if c.Len() != len(want) {
		t.Fatalf("%s: Len %d, want %d", what, c.Len(), len(want))
	}
	for _, p := range probes {
		got, ok := c.Get(p)
		w, wok := want[p]
		if ok != wok || !reflect.DeepEqual(got, w) {
			t.Fatalf("%s: Get(%q) = %v %v, want %v %v", what, p, got.Key, ok, w.Key, wok)
		}
	}
	var buf bytes.Buffer
	if err := WriteCache(&buf, c); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCache(&buf)
	if err != nil || back == nil || !reflect.DeepEqual(back.flat(), want) {
		t.Fatalf("%s: does not read back as written (%v)", what, err)
	}
}

// TestScanCacheLayers drives layered caches with random scans, removals
// and patches against plain maps: every cache reads as its map, and a
// cache another was built on never changes (it is a committed scan's,
// which the memo and the tracker still hand out).
func TestScanCacheLayers(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var probes []string
	for d := range 8 {
		probes = append(probes, fmt.Sprintf("d%d", d))
		for f := range 40 {
			probes = append(probes, fmt.Sprintf("d%d/f%02d", d, f))
		}
	}
	type kept struct {
		c    *ScanCache
		want map[string]CacheEntry
	}
	var all []kept
	want := map[string]CacheEntry{}
	for _, p := range probes {
		want[p] = cacheEntry(rng.Int())
	}
	c := cacheOf(want)
	overFlat, overLayer, flattened := 0, 0, 0
	for turn := range 300 {
		// A tracked scan: the entries of a few directories, looked at anew.
		next := NewScanCache()
		nextWant := maps.Clone(want)
		for range 1 + rng.Intn(3) {
			d := fmt.Sprintf("d%d", rng.Intn(8))
			for _, p := range probes {
				if p == d || strings.HasPrefix(p, d+"/") && rng.Intn(8) == 0 {
					e := cacheEntry(rng.Int())
					next.Put(p, e)
					nextWant[p] = e
				}
			}
		}
		wasLayer := c.under != nil
		out := c.merge(next)
		switch {
		case out.under == nil:
			flattened++
		case wasLayer:
			overLayer++
		default:
			overFlat++
		}
		// The restore's patch: a removed file, a removed directory, what
		// Verify read.
		if turn%3 == 0 {
			p := probes[rng.Intn(len(probes))]
			if strings.Contains(p, "/") {
				out.Delete(p)
				delete(nextWant, p)
			} else {
				out.DeleteBelow(p)
				out.Delete(p)
				for k := range nextWant {
					if k == p || strings.HasPrefix(k, p+"/") {
						delete(nextWant, k)
					}
				}
			}
			q := probes[rng.Intn(len(probes))]
			e := cacheEntry(rng.Int())
			out.Put(q, e)
			nextWant[q] = e
		}
		all = append(all, kept{c, want})
		c, want = out, nextWant
		checkCache(t, fmt.Sprintf("turn %d", turn), c, want, probes)
	}
	for i, k := range all {
		checkCache(t, fmt.Sprintf("the cache of turn %d, afterwards", i), k.c, k.want, probes)
	}
	if overFlat == 0 || overLayer == 0 || flattened == 0 {
		t.Fatalf("merges: %d over a flat cache, %d over a layer, %d flattened: the run missed a case", overFlat, overLayer, flattened)
	}
}

// TestScanCacheMergeCopiesNoBase pins what the layers are for: a tracked
// scan of a few entries over a large cache keeps the large one below it
// instead of copying it.
func TestScanCacheMergeCopiesNoBase(t *testing.T) {
	base := NewScanCache()
	for i := range 2000 {
		base.Put(fmt.Sprintf("f%04d", i), cacheEntry(i))
	}
	next := NewScanCache()
	next.Put("f0001", cacheEntry(-1))
	out := base.merge(next)
	if out.under != base || len(out.entries) != 1 {
		t.Fatalf("merge of 1 entry over 2,000 holds %d of its own (under the base: %v)", len(out.entries), out.under == base)
	}
	again := out.merge(NewScanCache())
	if again.under != base || len(again.entries) != 1 {
		t.Fatalf("a layer merged over a layer holds %d of its own, not over the flat base", len(again.entries))
	}
}

// TestReadCacheOfTheFlatFormat reads a cache file as WriteCache wrote it
// before the layers (a gob of the flat struct).
func TestReadCacheOfTheFlatFormat(t *testing.T) {
	type ScanCache struct {
		Version   int
		Entries   map[string]CacheEntry
		Links     map[string]string
		LinkNames []string
	}
	var buf bytes.Buffer
	old := ScanCache{Version: cacheVersion, Entries: map[string]CacheEntry{"a": cacheEntry(1), "b/c": cacheEntry(2)},
		Links: map[string]string{"b/c": "a"}, LinkNames: []string{"a", "b/c"}}
	if err := gob.NewEncoder(&buf).Encode(old); err != nil {
		t.Fatal(err)
	}
	c, err := ReadCache(&buf)
	if err != nil || c == nil {
		t.Fatalf("read: %v", err)
	}
	if !reflect.DeepEqual(c.flat(), old.Entries) || c.Links["b/c"] != "a" || len(c.LinkNames) != 2 {
		t.Fatalf("read back %d entries, links %v", c.Len(), c.Links)
	}
}
