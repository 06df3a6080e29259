package audit

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// memBlobs is a loader over trees kept in memory.
type memBlobs map[delta.ID][]byte

func (m memBlobs) LoadBlob(_ context.Context, _ delta.BlobType, id delta.ID) ([]byte, error) {
	b, ok := m[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: not found", id.Short())
	}
	return b, nil
}

func (m memBlobs) tree(t *testing.T, entries ...delta.Entry) delta.ID {
	t.Helper()
	tr := &delta.Tree{Entries: entries}
	tr.Sort()
	if err := tr.Check(); err != nil {
		t.Fatal(err)
	}
	b := tr.Encode()
	id := delta.Hash(b)
	m[id] = b
	return id
}

func file(name string, size uint64, mode uint32) delta.Entry {
	return delta.Entry{Name: name, Type: delta.TypeFile, Mode: mode, Size: size, Chunks: []delta.ID{delta.Hash([]byte(name))}}
}

// Two turns over a base: the first adds a file and deletes one of the
// base's (a whiteout), the second changes the new file's mode and starts
// processes. The report counts each turn's changes, says what each lost,
// and sums the turns.
func TestBuild(t *testing.T) {
	ctx := context.Background()
	m := memBlobs{}
	etc := m.tree(t, file("a.conf", 10, 0o644))
	base := m.tree(t, delta.Entry{Name: "etc", Type: delta.TypeDir, Mode: 0o755, Subtree: etc}, file("old.txt", 7, 0o644))
	whiteout := delta.Entry{Name: "old.txt", Type: delta.TypeWhiteout}
	up1 := m.tree(t, file("new.txt", 5, 0o644), whiteout)
	up2 := m.tree(t, file("new.txt", 5, 0o600), whiteout)
	proc := m.tree(t, file("pages.img", 4096, 0o600))
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cp1 := &delta.Checkpoint{ID: delta.Hash([]byte("cp1")), Turn: 1, Class: delta.ClassFS, BaseTree: base, FSTree: up1, Created: created,
		Stats: delta.Stats{BytesNew: 100, DurationNs: 2e6}}
	cp2 := &delta.Checkpoint{ID: delta.Hash([]byte("cp2")), Parent: cp1.ID, Turn: 2, Class: delta.ClassProcess, BaseTree: base, FSTree: up2,
		ProcTree: &proc, ProcChange: "a process appeared", Stats: delta.Stats{BytesNew: 50, DurationNs: 1e6}}
	rep, err := Build(ctx, "sb", []*delta.Checkpoint{cp1, cp2}, m)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sandbox != "sb" || len(rep.Turns) != 2 || rep.Totals.Turns != 2 || rep.Totals.BytesNew != 150 || rep.Totals.DurationMS != 3 {
		t.Fatalf("report %+v", rep)
	}
	if rep.Classes["fs"] != 1 || rep.Classes["process"] != 1 {
		t.Fatalf("classes %v", rep.Classes)
	}
	t1, t2 := rep.Turns[0], rep.Turns[1]
	if t1.Added != 1 || t1.Deleted != 1 || t1.Modified != 0 || len(t1.Files) != 2 {
		t.Fatalf("turn 1: %+v", t1)
	}
	byPath := map[string]File{}
	for _, f := range t1.Files {
		byPath[f.Path] = f
	}
	if f := byPath["/new.txt"]; f.Change != "added" || f.Size != 5 || f.PrevSize != 0 {
		t.Errorf("added file: %+v", f)
	}
	if f := byPath["/old.txt"]; f.Change != "deleted" || f.Size != 7 || f.PrevSize != 7 {
		t.Errorf("deleted file: %+v", f)
	}
	if t1.Processes.State != "none" || t1.Processes.Image || t1.ChatFSLoses.Summary != "nothing: no process was running" {
		t.Errorf("turn 1 processes: %+v, %+v", t1.Processes, t1.ChatFSLoses)
	}
	if t1.ChatOnlyLoses.Paths != 2 || t1.ChatOnlyLoses.Bytes != 5 {
		t.Errorf("turn 1 chat-only loss: %+v", t1.ChatOnlyLoses)
	}
	if t2.Modified != 1 || t2.Added != 0 || len(t2.Files) != 1 {
		t.Fatalf("turn 2: %+v", t2)
	}
	if f := t2.Files[0]; !slices.Equal(f.Meta, []string{"mode 0644 -> 0600"}) || f.Content {
		t.Errorf("mode change: %+v", f)
	}
	p := t2.Processes
	if !p.Image || p.State != "started" || p.ImageFiles != 1 || p.ImageBytes != 4096 || p.Why != "a process appeared" {
		t.Errorf("turn 2 processes: %+v", p)
	}
	if !t2.ChatOnlyLoses.Processes || !strings.Contains(t2.ChatFSLoses.Summary, "4096-byte image") {
		t.Errorf("turn 2 losses: %+v %+v", t2.ChatOnlyLoses, t2.ChatFSLoses)
	}
}

// A turn's file list stops at MaxFiles; its counts do not.
func TestBuildTruncates(t *testing.T) {
	m := memBlobs{}
	base := m.tree(t)
	var files []delta.Entry
	for i := range MaxFiles + 3 {
		files = append(files, file(fmt.Sprintf("f%04d", i), 1, 0o644))
	}
	cp := &delta.Checkpoint{ID: delta.Hash([]byte("cp")), Turn: 1, Class: delta.ClassFS, BaseTree: base, FSTree: m.tree(t, files...)}
	rep, err := Build(context.Background(), "sb", []*delta.Checkpoint{cp}, m)
	if err != nil {
		t.Fatal(err)
	}
	if tu := rep.Turns[0]; tu.Added != MaxFiles+3 || len(tu.Files) != MaxFiles || !tu.Truncated {
		t.Fatalf("added %d, listed %d, truncated %v", tu.Added, len(tu.Files), tu.Truncated)
	}
}

// The page embeds the report's JSON so that no string in it can end the
// script element it sits in.
func TestWriteHTML(t *testing.T) {
	rep := &Report{Sandbox: "sb", Turns: []Turn{{Turn: 1, Message: "</script><b>", Files: []File{}}}, Classes: map[string]int{}}
	var buf bytes.Buffer
	if err := WriteHTML(&buf, "sb <x>", rep); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if strings.Count(page, "</script>") != 2 || strings.Contains(page, "<b>") {
		t.Fatalf("the message escaped its script element:\n%s", page)
	}
	if !strings.Contains(page, "<title>turnsnap audit: sb &lt;x&gt;</title>") || !strings.Contains(page, `\u003c/script\u003e`) {
		t.Fatalf("title or data missing:\n%s", page)
	}
}
