package llmproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// convEntry is an exchange of conversation conv at turn with the given
// request.
func convEntry(conv string, turn int, req, reply string) *Entry {
	return &Entry{Conv: delta.Hash([]byte(conv)), Turn: turn, Shape: ShapeChat, Status: 200,
		ContentType: "application/json", Request: []byte(req), Response: []byte(reply)}
}

// commit takes, saves and commits a snapshot of every entry.
func commit(t *testing.T, j *TreeJournal, blobs delta.BlobSaver) *delta.ID {
	t.Helper()
	s := j.Snapshot("s", -1)
	root, err := s.Save(context.Background(), blobs)
	if err != nil {
		t.Fatal(err)
	}
	j.Committed(context.Background(), s)
	return root
}

func wantEntry(t *testing.T, j *TreeJournal, want *Entry) {
	t.Helper()
	e, err := j.Get(context.Background(), "s", want.Conv)
	if err != nil || e == nil {
		t.Fatalf("entry of turn %d: %v %v", want.Turn, e, err)
	}
	if !bytes.Equal(e.Request, want.Request) || !bytes.Equal(e.Response, want.Response) {
		t.Fatalf("entry of turn %d: request %.40q... reply %q, want %.40q... %q", want.Turn, e.Request, e.Response, want.Request, want.Response)
	}
}

// A conversation re-sent with other bytes after a later turn was stored
// as a delta against it (a retry at another temperature after the agent
// moved on): the later turn still rebuilds its own request, in the
// journal that wrote it and in one restored from the tree; the re-sent
// conversation answers with its newest exchange.
func TestTreeJournalDeltaBaseRewritten(t *testing.T) {
	ctx := context.Background()
	blobs := &lockedBlobs{m: memBlobs{}}
	j := NewTreeJournal(delta.IDs{}, blobs)
	prompt := strings.Repeat("system prompt and tools ", 400)
	x := convEntry("x", 1, `{"messages":["`+prompt+`","a"],"temperature":1}`, "reply x")
	d := convEntry("d", 2, `{"messages":["`+prompt+`","a","reply x","b"],"temperature":1}`, "reply d")
	x2 := convEntry("x", 1, `{"messages":["`+prompt+`","a"],"temperature":0.2}`, "reply x again")
	j.Put(ctx, "s", x)
	commit(t, j, blobs)
	j.Put(ctx, "s", d)
	commit(t, j, blobs)
	j.Put(ctx, "s", x2)
	root := commit(t, j, blobs)
	wantEntry(t, j, d)
	wantEntry(t, j, x2)
	fresh := NewTreeJournal(delta.IDs{}, blobs)
	if err := fresh.Reset(ctx, "s", root); err != nil {
		t.Fatal(err)
	}
	wantEntry(t, fresh, d)
	wantEntry(t, fresh, x2)
	// d was stored as a delta: far smaller than its request.
	if f := fresh.sbs["s"].idx[d.Conv].file; f.Size > 1024 {
		t.Fatalf("the delta entry of turn 2 is %d bytes for a request of %d", f.Size, len(d.Request))
	}

	// The same with the retry recorded before d was committed: d is then
	// stored against the retry's request, in the same tree.
	j2 := NewTreeJournal(delta.IDs{}, blobs)
	j2.Put(ctx, "s", x)
	commit(t, j2, blobs)
	j2.Put(ctx, "s", d)
	j2.Put(ctx, "s", x2)
	root = commit(t, j2, blobs)
	fresh = NewTreeJournal(delta.IDs{}, blobs)
	if err := fresh.Reset(ctx, "s", root); err != nil {
		t.Fatal(err)
	}
	wantEntry(t, fresh, d)
	wantEntry(t, fresh, x2)
}

// A journal tree written before deltas and chains (flat, every entry whole,
// "TSJ1") reads as before, and the next checkpoint chains onto it.
func TestTreeJournalReadsFlatTrees(t *testing.T) {
	ctx := context.Background()
	blobs := &lockedBlobs{m: memBlobs{}}
	var es []*Entry
	tr := &delta.Tree{}
	for i := 0; i < 3; i++ {
		e := convEntry(fmt.Sprint("c", i), i, fmt.Sprintf(`{"messages":[%d]}`, i), fmt.Sprint("reply ", i))
		es = append(es, e)
		plain, err := encodeEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		id := delta.Hash(plain)
		blobs.SaveBlob(ctx, delta.BlobData, id, plain)
		tr.Entries = append(tr.Entries, delta.Entry{Name: journalFileName(e.Conv, e.Turn), Type: delta.TypeFile, Mode: 0o600,
			Size: uint64(len(plain)), Chunks: []delta.ID{id}})
	}
	tr.Sort()
	enc := tr.Encode()
	old := delta.Hash(enc)
	blobs.SaveBlob(ctx, delta.BlobTree, old, enc)
	j := NewTreeJournal(delta.IDs{}, blobs)
	if err := j.Reset(ctx, "s", &old); err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		wantEntry(t, j, e)
	}
	next := convEntry("c3", 3, `{"messages":[0,1,2,3]}`, "reply 3")
	j.Put(ctx, "s", next)
	root := commit(t, j, blobs)
	top, err := delta.LoadTree(ctx, blobs, *root)
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Entries) != 2 || top.Entries[1].Name != journalPrev || top.Entries[1].Subtree != old {
		t.Fatalf("the next tree is %+v, want the new entry and prev = the flat tree", top.Entries)
	}
	fresh := NewTreeJournal(delta.IDs{}, blobs)
	if err := fresh.Reset(ctx, "s", root); err != nil {
		t.Fatal(err)
	}
	for _, e := range append(es, next) {
		wantEntry(t, fresh, e)
	}
}

// Hostile chains and deltas are corruption, never a wrong request: a tree
// holding only prev, a prev that is no directory, a delta whose base is
// missing, and a delta whose rebuilt request does not hash to its claim.
func TestTreeJournalHostileDeltas(t *testing.T) {
	ctx := context.Background()
	blobs := &lockedBlobs{m: memBlobs{}}
	save := func(tr *delta.Tree) *delta.ID {
		tr.Sort()
		enc := tr.Encode()
		id := delta.Hash(enc)
		blobs.SaveBlob(ctx, delta.BlobTree, id, enc)
		return &id
	}
	file := func(name string, plain []byte) delta.Entry {
		id := delta.Hash(plain)
		blobs.SaveBlob(ctx, delta.BlobData, id, plain)
		return delta.Entry{Name: name, Type: delta.TypeFile, Mode: 0o600, Size: uint64(len(plain)), Chunks: []delta.ID{id}}
	}
	base := convEntry("b", 0, `{"messages":["one"]}`, "r0")
	bplain, _ := encodeEntry(base)
	bf := file(journalFileName(base.Conv, 0), bplain)
	empty := save(&delta.Tree{Entries: []delta.Entry{bf}})
	for name, tr := range map[string]*delta.Tree{
		"only prev":      {Entries: []delta.Entry{{Name: journalPrev, Type: delta.TypeDir, Mode: 0o700, Subtree: *empty}}},
		"prev not a dir": {Entries: []delta.Entry{bf, {Name: journalPrev, Type: delta.TypeFile, Mode: 0o600}}},
	} {
		j := NewTreeJournal(delta.IDs{}, blobs)
		if err := j.Reset(ctx, "s", save(tr)); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	next := convEntry("n", 1, `{"messages":["one","two"]}`, "r1")
	good, _ := encodeDelta(next, bf.Name, base.Request)
	lie := bytes.Replace(good, []byte(`"two"`), []byte(`"owt"`), 1)
	orphan, _ := encodeDelta(next, journalFileName(delta.Hash([]byte("gone")), 0), base.Request)
	for name, plain := range map[string][]byte{"good": good, "hash mismatch": lie, "missing base": orphan} {
		root := save(&delta.Tree{Entries: []delta.Entry{bf, file(journalFileName(next.Conv, 1), plain)}})
		j := NewTreeJournal(delta.IDs{}, blobs)
		if err := j.Reset(ctx, "s", root); err != nil {
			t.Fatal(err)
		}
		e, err := j.Get(ctx, "s", next.Conv)
		if name == "good" {
			if err != nil || string(e.Request) != string(next.Request) {
				t.Fatalf("good delta: %v", err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// Overlapping checkpoints: a later snapshot taken before an earlier one
// committed holds fewer exchanges (an earlier turn of another
// conversation) and commits last. The exchanges only the earlier tree held
// are not lost: the next checkpoint's tree holds them again.
func TestTreeJournalOverlappingCheckpoints(t *testing.T) {
	ctx := context.Background()
	blobs := &lockedBlobs{m: memBlobs{}}
	j := NewTreeJournal(delta.IDs{}, blobs)
	prompt := strings.Repeat("tools ", 200)
	var es []*Entry
	req := `{"messages":["` + prompt + `"`
	for i := 0; i < 3; i++ {
		req += fmt.Sprintf(`,"m%d"`, i)
		e := convEntry(fmt.Sprint("a", i), i, req+"]}", fmt.Sprint("reply ", i))
		es = append(es, e)
		j.Put(ctx, "s", e)
	}
	s1 := j.Snapshot("s", 3)
	s2 := j.Snapshot("s", 1)
	for _, s := range []*Snapshot{s1, s2} {
		if _, err := s.Save(ctx, blobs); err != nil {
			t.Fatal(err)
		}
	}
	j.Committed(ctx, s1)
	j.Committed(ctx, s2)
	if s2.Len() != 1 {
		t.Fatalf("the later snapshot holds %d exchanges, want 1", s2.Len())
	}
	root := commit(t, j, blobs)
	fresh := NewTreeJournal(delta.IDs{}, blobs)
	if err := fresh.Reset(ctx, "s", root); err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		wantEntry(t, fresh, e)
		wantEntry(t, j, e)
	}
}
