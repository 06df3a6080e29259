package diffview

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

// memBlobs is a loader over chunks kept in memory.
type memBlobs map[delta.ID][]byte

func (m memBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	b, ok := m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: not found", id.Short())
	}
	return b, nil
}

// file makes a one-chunk file entry holding data, its chunk in m.
func (m memBlobs) file(name, data string) delta.Entry {
	id := delta.Hash([]byte(data))
	m[id] = []byte(data)
	return delta.Entry{Name: name, Type: delta.TypeFile, Mode: 0o644, Size: uint64(len(data)), Chunks: []delta.ID{id}}
}

func TestDescribePatches(t *testing.T) {
	ctx := context.Background()
	m := memBlobs{}
	oldCfg, newCfg := m.file("app.conf", "port=1\nname=x\n"), m.file("app.conf", "port=2\nname=x\n")
	oldBin, newBin := m.file("blob", "a\x00b"), m.file("blob", "a\x00c")
	added := m.file("new.txt", "hello\n")
	changes := []delta.Change{
		{Kind: delta.Modified, Path: "etc/app.conf", Type: delta.TypeFile, Old: oldCfg, New: newCfg},
		{Kind: delta.Modified, Path: "blob", Type: delta.TypeFile, Old: oldBin, New: newBin},
		{Kind: delta.Added, Path: "new.txt", Type: delta.TypeFile, New: added},
	}
	got, err := Describe(ctx, m, nil, nil, "", changes, Options{Patch: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d path changes for 3 changes", len(got))
	}
	cfg := got[0]
	if cfg.Path != "/etc/app.conf" || cfg.Change != "modified" || cfg.Binary || *cfg.OldSize != 14 || *cfg.NewSize != 14 {
		t.Fatalf("config change %+v", cfg)
	}
	for _, want := range []string{"a/etc/app.conf", "b/etc/app.conf", "-port=1", "+port=2"} {
		if !strings.Contains(cfg.Patch, want) {
			t.Errorf("patch lacks %q:\n%s", want, cfg.Patch)
		}
	}
	if len(cfg.Meta) != 1 || cfg.Meta[0].Field != "content" {
		t.Errorf("config meta %+v, want content only", cfg.Meta)
	}
	if !got[1].Binary || got[1].Patch != "" {
		t.Errorf("a file with a NUL byte: %+v", got[1])
	}
	if !strings.Contains(got[2].Patch, "/dev/null") || !strings.Contains(got[2].Patch, "+hello") || got[2].OldSize != nil {
		t.Errorf("added file: %+v", got[2])
	}

	// Past MaxPatchBytes a file is not read: it is marked binary.
	got, err = Describe(ctx, m, nil, nil, "", changes[:1], Options{Patch: true, MaxPatchBytes: 4})
	if err != nil || !got[0].Binary || got[0].Patch != "" {
		t.Fatalf("over the patch limit: %+v %v", got, err)
	}
	// Without Patch nothing is read at all.
	got, err = Describe(ctx, memBlobs{}, nil, nil, "", changes, Options{})
	if err != nil || got[0].Patch != "" || got[0].Binary {
		t.Fatalf("without patches: %+v %v", got, err)
	}
}

func TestMetaChanges(t *testing.T) {
	was := delta.Entry{Type: delta.TypeFile, Mode: 0o644, UID: 1, GID: 1, MtimeNs: 1,
		Xattrs: []delta.Xattr{{Name: "user.a", Value: []byte("1")}, {Name: "user.b", Value: []byte("x")}}}
	now := was
	now.Mode, now.UID, now.MtimeNs = 0o600, 2, 2
	now.Xattrs = []delta.Xattr{{Name: "user.b", Value: []byte("y")}, {Name: "user.c", Value: []byte{0, 1}}}
	var fields []string
	for _, m := range metaChanges(&was, &now) {
		fields = append(fields, m.Field+":"+m.Name+":"+m.Old+">"+m.New)
	}
	want := []string{
		"mode::0644>0600",
		"owner::1:1>2:1",
		"mtime::1970-01-01T00:00:00.000000001Z>1970-01-01T00:00:00.000000002Z",
		`xattr:user.a:"1">`,
		`xattr:user.b:"x">"y"`,
		"xattr:user.c:>(2 bytes)",
	}
	if strings.Join(fields, "\n") != strings.Join(want, "\n") {
		t.Fatalf("meta changes:\n%s\nwant:\n%s", strings.Join(fields, "\n"), strings.Join(want, "\n"))
	}
}

// A name that is not UTF-8 travels as base64 beside its lossy text form.
func TestDescribeRawNames(t *testing.T) {
	link := delta.Entry{Name: "l\xff", Type: delta.TypeSymlink, Target: "t\xfe"}
	changes := []delta.Change{{Kind: delta.Added, Path: "l\xff", Type: delta.TypeSymlink, New: link}}
	got, err := Describe(context.Background(), memBlobs{}, nil, nil, "", changes, Options{Patch: true})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].PathB64 != "L2z/" || got[0].Patch != "" || got[0].Binary {
		t.Fatalf("raw name: %+v", got[0])
	}
	if b64("plain") != "" {
		t.Fatal("a UTF-8 name got a base64 form")
	}
}
