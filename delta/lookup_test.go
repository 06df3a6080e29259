package delta

import (
	"context"
	"testing"
)

func TestLookupMergesLayers(t *testing.T) {
	ctx := context.Background()
	mem := newMem()
	save := func(es ...Entry) ID {
		data := (&Tree{Entries: es}).Encode()
		id := Hash(data)
		mem.SaveBlob(ctx, BlobTree, id, data)
		return id
	}
	file := func(name string, size uint64) Entry {
		return Entry{Name: name, Type: TypeFile, Mode: 0o644, Size: size}
	}
	base := save(
		Entry{Name: "lib", Type: TypeDir, Mode: 0o755, Subtree: save(file("a.so", 10), file("b.so", 20))},
		Entry{Name: "opt", Type: TypeDir, Mode: 0o755, Subtree: save(file("old", 1))},
	)
	upper := save(
		Entry{Name: "lib", Type: TypeDir, Mode: 0o755, Subtree: save(file("a.so", 11), Entry{Name: "b.so", Type: TypeWhiteout})},
		Entry{Name: "link", Type: TypeHardlink, Target: "lib/a.so"},
		Entry{Name: "opt", Type: TypeDir, Mode: 0o755, Opaque: true, Subtree: save(file("new", 2))},
	)
	for _, c := range []struct {
		path string
		ok   bool
		size uint64
	}{
		{"/lib/a.so", true, 11}, {"lib/b.so", false, 0}, {"/link", true, 11},
		{"/opt/old", false, 0}, {"/opt/new", true, 2}, {"/lib/a.so/x", false, 0}, {"/nope", false, 0},
	} {
		e, ok, err := Lookup(ctx, mem, Layers{base, upper}, c.path)
		if err != nil || ok != c.ok || (ok && e.Size != c.size) {
			t.Errorf("Lookup(%s) = %+v %v %v, want ok=%v size %d", c.path, e, ok, err, c.ok, c.size)
		}
	}
}
