package llmproxy

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// MaxJournalEntries bounds the exchanges of one journal tree: a long agent
// session is a few hundred model calls; a hostile tree cannot make a reset
// index millions.
const MaxJournalEntries = 1 << 16

// TreeJournal is a Journal whose entries are files of a tree that each
// checkpoint references as one of its roots (delta.Checkpoint.Journal), so
// the journal follows the checkpoint's lifetime (prune, gc, push, rebuild,
// verify) with no code of its own: the tree is stored like any other state,
// through the checkpoint's own content operation.
//
// Entries recorded since the last committed checkpoint are kept in memory
// (their chunks are saved by the next checkpoint, Snapshot.Save); once a
// checkpoint holding them is committed (Committed) only their chunk IDs are
// kept and their bytes are read back through the loader.
type TreeJournal struct {
	ids  delta.IDs // the home's content ID scheme
	load delta.BlobLoader

	mu  sync.Mutex
	idx map[string]map[delta.ID]*treeEntry // sandbox → conversation → entry
}

type treeEntry struct {
	turn int
	file delta.Entry // Name, Size and Chunks; the other fields are fixed
	// plain is the entry's plaintext until a committed checkpoint holds it.
	// Its chunks are cut and hashed by the checkpoint (Snapshot.Save), inside
	// the model's latency, not by Put on the reply's path: file.Chunks is
	// empty until then.
	plain []byte
}

// NewTreeJournal names entries' chunks and trees under ids (the home's
// scheme) and reads committed entries through load (the content
// repository).
func NewTreeJournal(ids delta.IDs, load delta.BlobLoader) *TreeJournal {
	return &TreeJournal{ids: ids, load: load, idx: map[string]map[delta.ID]*treeEntry{}}
}

// journalFileName names an entry's file: its conversation hash and turn.
func journalFileName(conv delta.ID, turn int) string {
	return conv.String() + "." + strconv.Itoa(turn)
}

// parseJournalFileName is journalFileName's inverse; it accepts only the
// spelling journalFileName writes.
func parseJournalFileName(name string) (delta.ID, int, bool) {
	h, t, ok := strings.Cut(name, ".")
	if !ok || len(h) != 64 || strings.ToLower(h) != h {
		return delta.ID{}, 0, false
	}
	conv, err := delta.ParseID(h)
	if err != nil {
		return delta.ID{}, 0, false
	}
	turn, err := strconv.Atoi(t)
	if err != nil || turn < -1 || strconv.Itoa(turn) != t {
		return delta.ID{}, 0, false
	}
	return conv, turn, true
}

// Put implements Journal: e becomes sandbox's entry for e.Conv.
func (j *TreeJournal) Put(ctx context.Context, sandbox string, e *Entry) error {
	plain, err := encodeEntry(e)
	if err != nil {
		return fmt.Errorf("journal entry of sandbox %s: %w", sandbox, err)
	}
	te := &treeEntry{turn: e.Turn, plain: plain, file: delta.Entry{
		Name: journalFileName(e.Conv, e.Turn), Type: delta.TypeFile, Mode: 0o600, Size: uint64(len(plain))}}
	j.mu.Lock()
	defer j.mu.Unlock()
	m := j.idx[sandbox]
	if m == nil {
		m = map[delta.ID]*treeEntry{}
		j.idx[sandbox] = m
	}
	if len(m) >= MaxJournalEntries && m[e.Conv] == nil {
		return fmt.Errorf("journal of sandbox %s holds %d entries, the limit: %w", sandbox, len(m), errdefs.ErrNoSpace)
	}
	m[e.Conv] = te
	return nil
}

// Empty says that sandbox's journal holds no entry, so that none of its
// calls can be answered from it: the proxy then forwards a call before
// reading its conversation.
func (j *TreeJournal) Empty(sandbox string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.idx[sandbox]) == 0
}

// Get implements Journal.
func (j *TreeJournal) Get(ctx context.Context, sandbox string, conv delta.ID) (*Entry, error) {
	j.mu.Lock()
	te := j.idx[sandbox][conv]
	var plain []byte
	var file delta.Entry
	if te != nil {
		plain, file = te.plain, te.file
	}
	j.mu.Unlock()
	if te == nil {
		return nil, nil
	}
	if plain == nil {
		var err error
		if plain, err = j.read(ctx, file); err != nil {
			return nil, fmt.Errorf("journal of sandbox %s: %w", sandbox, err)
		}
	}
	e, err := decodeEntry(plain)
	if err != nil {
		return nil, fmt.Errorf("journal of sandbox %s: entry %s: %w", sandbox, file.Name, err)
	}
	if c, t, _ := parseJournalFileName(file.Name); e.Conv != c || e.Turn != t || c != conv {
		return nil, fmt.Errorf("journal of sandbox %s: entry %s holds conversation %s turn %d: %w",
			sandbox, file.Name, e.Conv.Short(), e.Turn, errdefs.ErrCorrupt)
	}
	return e, nil
}

// read loads a committed entry's bytes, bounded by its declared size, each
// chunk verified by the loader.
func (j *TreeJournal) read(ctx context.Context, f delta.Entry) ([]byte, error) {
	if f.Size > MaxEntry {
		return nil, fmt.Errorf("entry %s: %d bytes, over the limit %d: %w", f.Name, f.Size, MaxEntry, errdefs.ErrCorrupt)
	}
	buf := make([]byte, 0, f.Size)
	for _, c := range f.Chunks {
		data, err := j.load.LoadBlob(ctx, delta.BlobData, c)
		if err != nil {
			return nil, fmt.Errorf("entry %s: chunk %s: %w", f.Name, c.Short(), err)
		}
		if uint64(len(buf)+len(data)) > f.Size {
			return nil, fmt.Errorf("entry %s: chunks exceed its size %d: %w", f.Name, f.Size, errdefs.ErrCorrupt)
		}
		buf = append(buf, data...)
	}
	if uint64(len(buf)) != f.Size {
		return nil, fmt.Errorf("entry %s: %d bytes of chunks, size %d: %w", f.Name, len(buf), f.Size, errdefs.ErrCorrupt)
	}
	return buf, nil
}

// Snapshot is what one checkpoint's journal tree holds.
type Snapshot struct {
	ids     delta.IDs
	sandbox string
	entries []snapEntry
}

// snapEntry is an entry as the snapshot took it (te's fields change under
// the journal's lock).
type snapEntry struct {
	te    *treeEntry
	file  delta.Entry
	plain []byte
}

// Len is the number of exchanges in the snapshot.
func (s *Snapshot) Len() int { return len(s.entries) }

// Snapshot takes sandbox's entries that a checkpoint closing turn before
// holds: those of earlier turns (every entry when before < 0, a turn the
// request does not number).
func (j *TreeJournal) Snapshot(sandbox string, before int) *Snapshot {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := &Snapshot{ids: j.ids, sandbox: sandbox}
	for _, te := range j.idx[sandbox] {
		if before < 0 || te.turn < before {
			s.entries = append(s.entries, snapEntry{te: te, file: te.file, plain: te.plain})
		}
	}
	return s
}

// Save stores the snapshot's tree through saver (the checkpoint's content
// operation): the chunks of entries no committed checkpoint holds yet, then
// the tree. It returns nil for an empty snapshot.
func (s *Snapshot) Save(ctx context.Context, saver delta.BlobSaver) (*delta.ID, error) {
	if len(s.entries) == 0 {
		return nil, nil
	}
	t := &delta.Tree{Entries: make([]delta.Entry, 0, len(s.entries))}
	for i := range s.entries {
		se := &s.entries[i]
		if plain := se.plain; plain != nil {
			// Cut as files are: the same exchange in two branches is the
			// same chunks. Committed keeps the IDs.
			var chunks []delta.ID
			if err := delta.ChunkReader(bytes.NewReader(plain), func(c []byte) error {
				id := s.ids.Hash(c)
				chunks = append(chunks, id)
				_, err := saver.SaveBlob(ctx, delta.BlobData, id, c)
				return err
			}); err != nil {
				return nil, fmt.Errorf("journal of sandbox %s: entry %s: %w", s.sandbox, se.file.Name, err)
			}
			se.file.Chunks = chunks
		}
		t.Entries = append(t.Entries, se.file)
	}
	t.Sort()
	if err := t.Check(); err != nil {
		return nil, fmt.Errorf("journal of sandbox %s: %w", s.sandbox, err)
	}
	for _, l := range t.MakeIndirect(s.ids) {
		if _, err := saver.SaveBlob(ctx, delta.BlobTree, l.ID, l.Data); err != nil {
			return nil, fmt.Errorf("journal of sandbox %s: chunk list %s: %w", s.sandbox, l.ID.Short(), err)
		}
	}
	enc := t.Encode()
	id := s.ids.Hash(enc)
	if _, err := saver.SaveBlob(ctx, delta.BlobTree, id, enc); err != nil {
		return nil, fmt.Errorf("journal of sandbox %s: tree %s: %w", s.sandbox, id.Short(), err)
	}
	return &id, nil
}

// Committed says a checkpoint holding s is committed: its entries' bytes
// are in the store and need not be kept in memory.
func (j *TreeJournal) Committed(s *Snapshot) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, se := range s.entries {
		if se.plain != nil && len(se.file.Chunks) == 0 {
			continue // never saved: keep the bytes for the next checkpoint
		}
		se.te.file.Chunks = se.file.Chunks
		se.te.plain = nil
	}
}

// Reset makes sandbox's journal exactly the tree root (a restored
// checkpoint's Journal; nil empties it). The tree is checked, not the
// entries' bytes: each is read and verified when a call asks for it. On
// error the journal is left as it was.
func (j *TreeJournal) Reset(ctx context.Context, sandbox string, root *delta.ID) error {
	m := map[delta.ID]*treeEntry{}
	if root != nil {
		t, err := delta.LoadTree(ctx, j.load, *root)
		if err != nil {
			return fmt.Errorf("resetting the journal of sandbox %s: %w", sandbox, err)
		}
		if m, err = journalIndex(t); err != nil {
			return fmt.Errorf("resetting the journal of sandbox %s: tree %s: %w", sandbox, root.Short(), err)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.idx[sandbox] = m
	return nil
}

// journalIndex checks a journal tree (docs/FORMAT.md, "Model-call journal")
// and indexes it by conversation.
func journalIndex(t *delta.Tree) (map[delta.ID]*treeEntry, error) {
	if len(t.Entries) > MaxJournalEntries {
		return nil, fmt.Errorf("%d entries, over the limit %d: %w", len(t.Entries), MaxJournalEntries, errdefs.ErrCorrupt)
	}
	m := make(map[delta.ID]*treeEntry, len(t.Entries))
	for _, e := range t.Entries {
		conv, turn, ok := parseJournalFileName(e.Name)
		switch {
		case !ok:
			return nil, fmt.Errorf("entry %q is not named <conversation>.<turn>: %w", e.Name, errdefs.ErrCorrupt)
		case e.Type != delta.TypeFile || e.Mode != 0o600 || e.UID != 0 || e.GID != 0 || e.MtimeNs != 0 || len(e.Xattrs) != 0:
			return nil, fmt.Errorf("entry %s is not a plain 0600 file: %w", e.Name, errdefs.ErrCorrupt)
		case e.Size > MaxEntry:
			return nil, fmt.Errorf("entry %s: %d bytes, over the limit %d: %w", e.Name, e.Size, MaxEntry, errdefs.ErrCorrupt)
		case uint64(len(e.Chunks)) > e.Size/delta.ChunkMin+2:
			return nil, fmt.Errorf("entry %s: %d chunks for %d bytes: %w", e.Name, len(e.Chunks), e.Size, errdefs.ErrCorrupt)
		case m[conv] != nil:
			return nil, fmt.Errorf("conversation %s twice: %w", conv.Short(), errdefs.ErrCorrupt)
		}
		f := e
		f.Chunks = append([]delta.ID(nil), e.Chunks...)
		m[conv] = &treeEntry{turn: turn, file: f}
	}
	return m, nil
}
