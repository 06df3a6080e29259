package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
)

func testRoundTrip(t *testing.T, s upload.Store) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"small", []byte("hello")},
		{"dir/sub/obj", randBytes(1, 4<<10)},
		{"big/object_20MiB.bin", randBytes(2, 20<<20)},
	} {
		put(t, s, tc.name, tc.data)
		wantObject(t, s, tc.name, tc.data)
	}
}

// testOverwrite replaces an object repeatedly while another goroutine reads
// it: every read must see one version whole, never a mix or a gap.
func testOverwrite(t *testing.T, s upload.Store) {
	const name = "refs/main"
	versions := [][]byte{bytes.Repeat([]byte{'a'}, 1<<20), bytes.Repeat([]byte{'b'}, 1<<19+7)}
	put(t, s, name, versions[0])
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			got, err := upload.ReadAll(context.Background(), s, name)
			if err != nil {
				t.Errorf("Get %s during overwrite: %v", name, err)
				return
			}
			if !bytes.Equal(got, versions[0]) && !bytes.Equal(got, versions[1]) {
				t.Errorf("Get %s during overwrite: %d bytes that are neither version", name, len(got))
				return
			}
		}
	})
	for i := range 20 {
		put(t, s, name, versions[(i+1)%2])
	}
	close(done)
	wg.Wait()
	wantObject(t, s, name, versions[0])
}

func testMissing(t *testing.T, s upload.Store) {
	put(t, s, "file", []byte("x"))
	for _, name := range []string{"missing", "no/such/dir/obj", "file/child"} {
		wantAbsent(t, s, name)
		if _, err := upload.GetRange(t.Context(), s, name, 0, 1); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("GetRange %s: got error %v, want ErrNotFound", name, err)
		}
	}
}

func testInvalidNames(t *testing.T, s upload.Store) {
	ctx := t.Context()
	for _, name := range []string{"", "/abs", "a/../b", "a//b", "a b", "..", ".", "a/", "a/./b", `a\b`, "ä", "a\x00b"} {
		want := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s %q: got error %v, want ErrInvalid", op, name, err)
			}
		}
		want("Put", upload.PutBytes(ctx, s, name, []byte("x")))
		rc, err := s.Get(ctx, name)
		if err == nil {
			rc.Close()
		}
		want("Get", err)
		_, err = s.Stat(ctx, name)
		want("Stat", err)
		want("Delete", s.Delete(ctx, name))
	}
	if got := list(t, s, ""); len(got) != 0 {
		t.Errorf("after invalid Puts, List lists %v", got)
	}
}

func testSizeMismatch(t *testing.T, s upload.Store) {
	ctx := t.Context()
	data := randBytes(3, 100)
	for _, tc := range []struct {
		name string
		give []byte
		size int64
	}{
		{"short", data[:50], 100},
		{"long", data, 50},
		{"long-by-one", data, 99},
		{"short-to-empty", nil, 1},
		{"long-from-empty", data[:1], 0},
	} {
		if err := s.Put(ctx, tc.name, plainReader{bytes.NewReader(tc.give)}, tc.size); err == nil {
			t.Errorf("Put %s of %d bytes declared as %d: no error", tc.name, len(tc.give), tc.size)
		}
		wantAbsent(t, s, tc.name)
	}
	// A failed overwrite must leave the old object as it was.
	put(t, s, "kept", data)
	if err := s.Put(ctx, "kept", plainReader{bytes.NewReader(data[:10])}, 20); err == nil {
		t.Errorf("Put of a short reader over an existing object: no error")
	}
	wantObject(t, s, "kept", data)
}

func testList(t *testing.T, s upload.Store) {
	// '-' and '.' sort before '/', and '0' after it: a walk by directory
	// gets this order wrong.
	all := []string{"a-b", "a.x", "a/b", "a/c/d", "a0", "b", "packs/ab/1", "packs/ab/2", "packs/ac/3"}
	for _, name := range slices.Backward(all) {
		put(t, s, name, []byte(name))
	}
	want := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, fmt.Sprintf("%s:%d", n, len(n)))
		}
		return out
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", want(all...)},
		{"a", want(all[:5]...)},
		{"a/", want("a/b", "a/c/d")},
		{"a/c", want("a/c/d")},
		{"packs/", want(all[6:]...)},
		{"packs/a", want(all[6:]...)},
		{"packs/ab", want("packs/ab/1", "packs/ab/2")},
		{"packs/ab/", want("packs/ab/1", "packs/ab/2")},
		{"packs/ab/1", want("packs/ab/1")},
		{"zzz", nil},
		{"nodir/", nil},
		{"b/", nil},
	} {
		if got := list(t, s, tc.prefix); !slices.Equal(got, tc.want) {
			t.Errorf("List %q:\n got %v\nwant %v", tc.prefix, got, tc.want)
		}
	}
}

func testListStops(t *testing.T, s upload.Store) {
	for _, name := range []string{"x/1", "x/2", "x/3", "x/4"} {
		put(t, s, name, nil)
	}
	stop := errors.New("stop here")
	var seen []string
	err := s.List(t.Context(), "x/", func(info upload.ObjectInfo) error {
		seen = append(seen, info.Name)
		if len(seen) == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Errorf("List: got error %v, want fn's error", err)
	}
	if !slices.Equal(seen, []string{"x/1", "x/2"}) {
		t.Errorf("List called fn for %v, want [x/1 x/2] and then stop", seen)
	}
}

func testDelete(t *testing.T, s upload.Store) {
	ctx := t.Context()
	put(t, s, "d/obj", []byte("x"))
	put(t, s, "d/other", []byte("y"))
	for i := range 2 {
		if err := s.Delete(ctx, "d/obj"); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
		wantAbsent(t, s, "d/obj")
	}
	if err := s.Delete(ctx, "never/was"); err != nil {
		t.Errorf("Delete of a name never put: %v", err)
	}
	if got := list(t, s, ""); !slices.Equal(got, []string{"d/other:1"}) {
		t.Errorf("after Delete, List gives %v, want [d/other:1]", got)
	}
}

func testGetRange(t *testing.T, s upload.Store) {
	data := randBytes(4, 3<<20+17)
	put(t, s, "ranged", data)
	size := int64(len(data))
	for _, r := range [][2]int64{{0, 10}, {100, 1000}, {size - 5, 5}, {0, size}, {1<<20 - 1, 1<<20 + 2}} {
		rc, err := upload.GetRange(t.Context(), s, "ranged", r[0], r[1])
		if err != nil {
			t.Fatalf("GetRange %d+%d: %v", r[0], r[1], err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("GetRange %d+%d: read: %v", r[0], r[1], err)
		}
		if !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Errorf("GetRange %d+%d: got %d bytes, not the ones asked for", r[0], r[1], len(got))
		}
	}
}

func testCancel(t *testing.T, s upload.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := upload.PutBytes(ctx, s, "cancelled/before", []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("Put with a cancelled context: got error %v, want context.Canceled", err)
	}
	wantAbsent(t, s, "cancelled/before")

	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	data := randBytes(5, 8<<20)
	r := &cancelReader{r: bytes.NewReader(data), after: 2 << 20, cancel: cancel}
	if err := s.Put(ctx, "cancelled/midway", r, int64(len(data))); err == nil {
		t.Errorf("Put cancelled midway: no error")
	}
	wantAbsent(t, s, "cancelled/midway")
}

func testConcurrentPuts(t *testing.T, s upload.Store) {
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("concurrent/new/%02d", i)
			if err := upload.PutBytes(t.Context(), s, name, randBytes(byte(i), 64<<10+i)); err != nil {
				t.Errorf("Put %s: %v", name, err)
			}
		})
	}
	wg.Wait()
	for i := range n {
		wantObject(t, s, fmt.Sprintf("concurrent/new/%02d", i), randBytes(byte(i), 64<<10+i))
	}
	if got := list(t, s, "concurrent/"); len(got) != n {
		t.Errorf("List after concurrent Puts: %d objects, want %d", len(got), n)
	}
}
