package llmproxy

import (
	"bytes"
	"context"
	"encoding/binary"
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
// A turn costs what it changed (docs/FORMAT.md, "Model-call journal"):
//
//   - a checkpoint's journal tree holds only the exchanges recorded since
//     the previous one's, plus a directory "prev" naming that tree, so
//     the trees form a chain and none is rewritten;
//   - an exchange whose request extends an earlier turn's (an agent's
//     conversation grows by appending) is stored as a delta entry: the
//     bytes between the prefix and the suffix it shares with that turn's
//     request, plus its reply.
//
// Entries recorded since the last committed checkpoint are kept in memory
// (their chunks are saved by the next checkpoint, Snapshot.Save); once a
// checkpoint holding them is committed (Committed) only their chunk IDs are
// kept and their bytes are read back through the loader. The whole
// requests of a few recent entries stay in memory as the next turn's delta
// base.
type TreeJournal struct {
	ids  delta.IDs // the home's content ID scheme
	load delta.BlobLoader

	mu  sync.Mutex
	seq uint64                     // snapshots taken
	sbs map[string]*sandboxJournal // by sandbox
	reruns
}

// sandboxJournal is one sandbox's journal.
type sandboxJournal struct {
	idx map[delta.ID]*treeEntry // conversation → its newest entry
	// root is the journal tree of the newest committed checkpoint (or of
	// the restored one), rootSet what it holds by conversation, and depth
	// the trees in its chain.
	root    *delta.ID
	rootSet map[delta.ID]*treeEntry
	rootSeq uint64
	depth   int
	files   int // entries in root's chain, shadowed ones included
	gen     uint64
	// recent are the entries whose whole request is kept (treeEntry.req):
	// the next turn's delta bases.
	recent []*treeEntry
}

// recentRequests bounds the whole requests a sandbox keeps in memory as
// delta bases: an agent's next call extends its last one; a few more cover
// sub-agents taking turns.
const recentRequests = 4

type treeEntry struct {
	conv delta.ID
	turn int
	file delta.Entry // Name, Size and Chunks once committed; the other fields are fixed
	// entry is the exchange until a committed checkpoint holds it. Its
	// chunks are cut and hashed by the checkpoint (Snapshot.Save), inside
	// the model's latency, not by Put on the reply's path.
	entry *Entry
	req   []byte // the whole request, while the entry is recent
	// base is the entry a committed delta entry's request extends, when
	// this process wrote it; scope resolves it by name for an entry read
	// from a tree (Reset).
	base  *treeEntry
	scope *journalLevel
}

// journalLevel is one tree of a chain, for resolving a delta entry's base:
// the entry of that name in the entry's own tree or the nearest older one,
// which is the one the writer saw.
type journalLevel struct {
	names map[string]*treeEntry
	older *journalLevel
}

// NewTreeJournal names entries' chunks and trees under ids (the home's
// scheme) and reads committed entries through load (the content
// repository).
func NewTreeJournal(ids delta.IDs, load delta.BlobLoader) *TreeJournal {
	return &TreeJournal{ids: ids, load: load, sbs: map[string]*sandboxJournal{}}
}

// sb returns sandbox's journal, made empty if need be; j.mu is held.
func (j *TreeJournal) sb(sandbox string) *sandboxJournal {
	sj := j.sbs[sandbox]
	if sj == nil {
		sj = &sandboxJournal{idx: map[delta.ID]*treeEntry{}, rootSet: map[delta.ID]*treeEntry{}}
		j.sbs[sandbox] = sj
	}
	return sj
}

// remember makes te one of sj's recent entries, with its whole request;
// the oldest beyond recentRequests drops its copy. j.mu is held.
func (sj *sandboxJournal) remember(te *treeEntry, req []byte) {
	te.req = req
	for i, r := range sj.recent {
		if r == te {
			sj.recent = append(sj.recent[:i], sj.recent[i+1:]...)
			break
		}
	}
	sj.recent = append(sj.recent, te)
	if len(sj.recent) > recentRequests {
		sj.recent[0].req = nil
		sj.recent = sj.recent[1:]
	}
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

// Put implements Journal: e becomes sandbox's entry for e.Conv. It only
// keeps e: the reply's last byte waits for no encoding.
func (j *TreeJournal) Put(ctx context.Context, sandbox string, e *Entry) error {
	if n := len(entryMagic) + 3*binary.MaxVarintLen64 + 512 + len(e.Request) + len(e.Response); n > MaxEntry {
		return fmt.Errorf("journal entry of sandbox %s: %d bytes, more than the limit of %d: %w", sandbox, n, MaxEntry, errdefs.ErrInvalid)
	}
	te := &treeEntry{conv: e.Conv, turn: e.Turn, entry: e, file: delta.Entry{
		Name: journalFileName(e.Conv, e.Turn), Type: delta.TypeFile, Mode: 0o600}}
	j.mu.Lock()
	defer j.mu.Unlock()
	sj := j.sb(sandbox)
	if len(sj.idx) >= MaxJournalEntries && sj.idx[e.Conv] == nil {
		return fmt.Errorf("journal of sandbox %s holds %d entries, the limit: %w", sandbox, len(sj.idx), errdefs.ErrNoSpace)
	}
	sj.idx[e.Conv] = te
	sj.remember(te, e.Request)
	return nil
}

// Empty says that sandbox's journal holds no entry, so that none of its
// calls can be answered from it: the proxy then forwards a call before
// reading its conversation.
func (j *TreeJournal) Empty(sandbox string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sbs[sandbox] == nil || len(j.sbs[sandbox].idx) == 0
}

// Get implements Journal.
func (j *TreeJournal) Get(ctx context.Context, sandbox string, conv delta.ID) (*Entry, error) {
	j.mu.Lock()
	var te *treeEntry
	if sj := j.sbs[sandbox]; sj != nil {
		te = sj.idx[conv]
	}
	var e *Entry
	if te != nil {
		e = te.entry
	}
	j.mu.Unlock()
	if te == nil || e != nil {
		return e, nil
	}
	e, err := j.readEntry(ctx, te)
	if err != nil {
		return nil, fmt.Errorf("journal of sandbox %s: %w", sandbox, err)
	}
	if e.Conv != conv {
		return nil, fmt.Errorf("journal of sandbox %s: entry %s holds conversation %s: %w", sandbox, te.file.Name, e.Conv.Short(), errdefs.ErrCorrupt)
	}
	j.mu.Lock()
	if sj := j.sbs[sandbox]; sj != nil && sj.rootSet[conv] == te {
		// A re-run's next call extends this one: keep it as a delta base.
		sj.remember(te, e.Request)
	}
	j.mu.Unlock()
	return e, nil
}

// deltaStep is one delta entry read on the way down to a whole request.
type deltaStep struct {
	name   string
	h      entryHeader
	middle []byte
}

// readEntry reads a committed entry and rebuilds its whole request: down
// its chain of bases (each an earlier turn, so the chain ends) to a whole
// request, in memory or stored, then back up, each step checked against
// the lengths it declares and the result against the request's hash.
func (j *TreeJournal) readEntry(ctx context.Context, top *treeEntry) (*Entry, error) {
	var (
		steps []deltaStep
		whole []byte
		resp  []byte
		topH  entryHeader
	)
	cur := top
	for {
		j.mu.Lock()
		f, mem, req := cur.file, cur.entry, cur.req
		j.mu.Unlock()
		if cur != top {
			if mem != nil {
				whole = mem.Request
				break
			}
			if req != nil {
				whole = req
				break
			}
		}
		plain, err := j.read(ctx, f)
		if err != nil {
			return nil, err
		}
		h, rq, rs, err := decodeParts(plain)
		if err != nil {
			return nil, fmt.Errorf("entry %s: %w", f.Name, err)
		}
		if c, t, _ := parseJournalFileName(f.Name); h.Conv != c || h.Turn != t {
			return nil, fmt.Errorf("entry %s holds conversation %s turn %d: %w", f.Name, h.Conv.Short(), h.Turn, errdefs.ErrCorrupt)
		}
		if cur == top {
			topH, resp = h, rs
		}
		if h.Base == "" {
			whole = rq
			break
		}
		steps = append(steps, deltaStep{name: f.Name, h: h, middle: rq})
		j.mu.Lock()
		next := cur.base
		if next == nil && cur.scope != nil {
			next = cur.scope.find(h.Base)
		}
		j.mu.Unlock()
		if next == nil {
			return nil, fmt.Errorf("entry %s: its base %s is not in the journal: %w", f.Name, h.Base, errdefs.ErrCorrupt)
		}
		if next.file.Name != h.Base {
			return nil, fmt.Errorf("entry %s: base %s resolved to %s: %w", f.Name, h.Base, next.file.Name, errdefs.ErrCorrupt)
		}
		cur = next
	}
	req := whole
	for i := len(steps) - 1; i >= 0; i-- {
		st := steps[i]
		if st.h.Prefix+st.h.Suffix > len(req) || st.h.Prefix+len(st.middle)+st.h.Suffix > MaxEntry {
			return nil, fmt.Errorf("entry %s: shares %d+%d bytes with a base request of %d: %w", st.name, st.h.Prefix, st.h.Suffix, len(req), errdefs.ErrCorrupt)
		}
		out := make([]byte, 0, st.h.Prefix+len(st.middle)+st.h.Suffix)
		out = append(out, req[:st.h.Prefix]...)
		out = append(out, st.middle...)
		req = append(out, req[len(req)-st.h.Suffix:]...)
	}
	if topH.Req != nil && delta.Hash(req) != *topH.Req {
		return nil, fmt.Errorf("entry %s: its rebuilt request does not match its hash: %w", top.file.Name, errdefs.ErrCorrupt)
	}
	if len(steps) == 0 {
		req = bytes.Clone(req)
	}
	return entryOf(topH, req, bytes.Clone(resp)), nil
}

// find resolves a base name from level l down the chain; j.mu is held.
func (l *journalLevel) find(name string) *treeEntry {
	for ; l != nil; l = l.older {
		if te := l.names[name]; te != nil {
			return te
		}
	}
	return nil
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

// Snapshot is what one checkpoint's journal tree holds: the tree of the
// newest committed checkpoint (prev) and the entries recorded since.
type Snapshot struct {
	j       *TreeJournal
	ids     delta.IDs
	sandbox string
	seq     uint64
	gen     uint64
	prev    *delta.ID
	prevSet map[delta.ID]*treeEntry // what prev holds, by conversation
	depth   int
	files   int
	held    int // exchanges of prev not shadowed by the new entries
	entries []snapEntry
	cands   []candidate
	cold    []*treeEntry // committed entries to read as delta bases when no candidate is in memory
	root    *delta.ID    // Save's result
	saved   bool
}

// snapEntry is an entry as the snapshot took it, and as Save wrote it.
type snapEntry struct {
	te   *treeEntry
	e    *Entry
	file delta.Entry
	base *treeEntry
}

// candidate is an entry the snapshot's tree holds whose whole request is
// at hand: a possible delta base.
type candidate struct {
	te  *treeEntry
	req []byte
}

// Len is the number of exchanges in the snapshot.
func (s *Snapshot) Len() int { return s.held + len(s.entries) }

// MaxJournalDepth bounds the trees of a journal's chain (one per
// checkpoint that recorded an exchange). Past it a checkpoint starts a new
// chain with only its own entries: the older exchanges leave the journal
// (their calls go to the model) rather than make a restore read more trees.
const MaxJournalDepth = 4096

// Snapshot takes sandbox's entries that a checkpoint closing turn before
// holds: those of the newest committed checkpoint's tree, and those
// recorded since of earlier turns (every one when before < 0, a turn the
// request does not number).
func (j *TreeJournal) Snapshot(sandbox string, before int) *Snapshot {
	j.mu.Lock()
	defer j.mu.Unlock()
	sj := j.sb(sandbox)
	j.seq++
	s := &Snapshot{j: j, ids: j.ids, sandbox: sandbox, seq: j.seq, gen: sj.gen, prev: sj.root, prevSet: sj.rootSet, depth: sj.depth, files: sj.files}
	newConvs := map[delta.ID]bool{}
	for _, te := range sj.idx {
		if te.entry != nil && (before < 0 || te.turn < before) {
			s.entries = append(s.entries, snapEntry{te: te, e: te.entry})
			s.cands = append(s.cands, candidate{te: te, req: te.entry.Request})
			newConvs[te.conv] = true
		}
	}
	for conv := range sj.rootSet {
		if !newConvs[conv] {
			s.held++
		}
	}
	for _, te := range sj.recent {
		if te.entry == nil && te.req != nil && sj.rootSet[te.conv] == te && !newConvs[te.conv] {
			s.cands = append(s.cands, candidate{te: te, req: te.req})
		}
	}
	if len(s.cands) == len(s.entries) && len(s.entries) > 0 {
		// Nothing committed is at hand (a restart or a restore): the
		// newest earlier turn the tree holds is read back by Save.
		best := -1
		for conv, te := range sj.rootSet {
			if !newConvs[conv] && te.turn >= 0 && te.turn > best {
				best, s.cold = te.turn, s.cold[:0]
			}
			if !newConvs[conv] && te.turn == best && len(s.cold) < 2 {
				s.cold = append(s.cold, te)
			}
		}
	}
	return s
}

// minShared is the fewest bytes an entry must share with a base to be
// stored as a delta: less would save less than the reference costs.
const minShared = 512

// Save stores the snapshot's tree through saver (the checkpoint's content
// operation): each new entry, as a delta against the earlier turn's request
// it shares the most with, or whole; then a tree of the new entries and
// "prev", the newest committed checkpoint's tree. With no new entry it is
// that tree; it returns nil for an empty journal.
func (s *Snapshot) Save(ctx context.Context, saver delta.BlobSaver) (*delta.ID, error) {
	if len(s.entries) == 0 {
		s.root, s.saved = s.prev, true
		return s.prev, nil
	}
	for _, te := range s.cold {
		if e, err := s.j.readEntry(ctx, te); err == nil {
			s.cands = append(s.cands, candidate{te: te, req: e.Request})
		}
	}
	prev, depth := s.prev, s.depth+1
	if prev != nil && (depth > MaxJournalDepth || s.files+len(s.entries) > MaxJournalEntries) {
		prev, depth = nil, 1
	}
	t := &delta.Tree{Entries: make([]delta.Entry, 0, len(s.entries)+1)}
	for i := range s.entries {
		se := &s.entries[i]
		plain, base, err := s.encode(se, prev != nil)
		if err != nil {
			return nil, fmt.Errorf("journal of sandbox %s: entry %s: %w", s.sandbox, se.te.file.Name, err)
		}
		// Cut as files are: the same exchange in two branches is the same
		// chunks. Committed keeps the IDs.
		var chunks []delta.ID
		if err := delta.ChunkReader(bytes.NewReader(plain), func(c []byte) error {
			id := s.ids.Hash(c)
			chunks = append(chunks, id)
			_, err := saver.SaveBlob(ctx, delta.BlobData, id, c)
			return err
		}); err != nil {
			return nil, fmt.Errorf("journal of sandbox %s: entry %s: %w", s.sandbox, se.te.file.Name, err)
		}
		se.file = se.te.file
		se.file.Size, se.file.Chunks, se.base = uint64(len(plain)), chunks, base
		t.Entries = append(t.Entries, se.file)
	}
	if prev != nil {
		t.Entries = append(t.Entries, delta.Entry{Name: journalPrev, Type: delta.TypeDir, Mode: 0o700, Subtree: *prev})
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
	if prev == nil {
		s.files, s.depth = 0, 0
	}
	s.root, s.saved, s.depth, s.files = &id, true, depth, s.files+len(s.entries)
	return &id, nil
}

// journalPrev names the directory of a journal tree that is the previous
// tree of its chain.
const journalPrev = "prev"

// encode lays out one new entry: a delta against the candidate of an
// earlier turn it shares the most bytes with, or whole. withPrev says the
// tree keeps its chain, so committed candidates are in it.
func (s *Snapshot) encode(se *snapEntry, withPrev bool) ([]byte, *treeEntry, error) {
	var best *candidate
	bestShared := minShared - 1
	for i := range s.cands {
		c := &s.cands[i]
		if c.te == se.te || c.te.turn < 0 || c.te.turn >= se.te.turn {
			continue
		}
		if c.te.entry == nil && !withPrev {
			continue // a committed entry outside the new chain
		}
		if p, q := sharedEnds(c.req, se.e.Request); p+q > bestShared {
			best, bestShared = c, p+q
		}
	}
	if best == nil {
		plain, err := encodeEntry(se.e)
		return plain, nil, err
	}
	plain, err := encodeDelta(se.e, best.te.file.Name, best.req)
	return plain, best.te, err
}

// Committed says a checkpoint holding s is committed: its entries' bytes
// are in the store and need not be kept in memory, and its tree is the one
// the next checkpoint's chains onto. A snapshot older than the newest
// committed one, or taken before a Reset, changes nothing: its entries
// stay in memory for the next checkpoint.
//
// Two checkpoints of a sandbox may overlap: the later snapshot was taken
// before the earlier one committed, so its tree chains onto the tree
// before that. The exchanges only the earlier tree held are read back and
// kept for the next checkpoint, so that no tree loses them.
func (j *TreeJournal) Committed(ctx context.Context, s *Snapshot) {
	j.mu.Lock()
	sj := j.sbs[s.sandbox]
	if sj == nil || !s.saved || s.gen != sj.gen || s.seq < sj.rootSeq {
		j.mu.Unlock()
		return
	}
	restarted := s.root != s.prev && s.depth == 1 && s.prev != nil
	// rootSet is never changed in place: a snapshot keeps the one it saw.
	set := make(map[delta.ID]*treeEntry, len(s.prevSet)+len(s.entries))
	if !restarted {
		for conv, te := range s.prevSet {
			set[conv] = te
		}
	}
	for _, se := range s.entries {
		set[se.te.conv] = se.te
	}
	var orphans []*treeEntry
	for conv, te := range sj.rootSet {
		if set[conv] != te && te.entry == nil && sj.idx[conv] == te && !restarted {
			orphans = append(orphans, te)
		}
	}
	sj.root, sj.rootSet, sj.rootSeq, sj.depth, sj.files = s.root, set, s.seq, s.depth, s.files
	for _, se := range s.entries {
		te := se.te
		if te.entry != se.e && te.entry != nil {
			continue
		}
		// The encoding and base this root's tree holds (an overlapping
		// snapshot committed first may have written another).
		te.file, te.base = se.file, se.base
		te.entry = nil
		if sj.idx[te.conv] == te {
			sj.remember(te, se.e.Request)
		}
	}
	if restarted {
		// The chain was restarted: the older exchanges left the journal.
		for conv, te := range sj.idx {
			if te.entry == nil && sj.rootSet[conv] != te {
				delete(sj.idx, conv)
			}
		}
	}
	gen := sj.gen
	j.mu.Unlock()
	for _, te := range orphans {
		e, err := j.readEntry(ctx, te)
		j.mu.Lock()
		if sj := j.sbs[s.sandbox]; sj != nil && sj.gen == gen && sj.idx[te.conv] == te && sj.rootSet[te.conv] != te {
			if err == nil {
				te.entry = e // recorded again by the next checkpoint
			} else {
				delete(sj.idx, te.conv) // asked of the model, never answered wrong
			}
		}
		j.mu.Unlock()
	}
}

// Reset makes sandbox's journal exactly the tree root (a restored
// checkpoint's Journal; nil empties it) and arms its exchanges for the
// sandbox's re-run (reruns). The trees of its chain are checked, not the
// entries' bytes: each is read and verified when a call asks for it. On
// error the journal is left as it was.
func (j *TreeJournal) Reset(ctx context.Context, sandbox string, root *delta.ID) error {
	m := map[delta.ID]*treeEntry{}
	depth, files := 0, 0
	if root != nil {
		var err error
		if m, depth, files, err = loadJournal(ctx, j.load, *root); err != nil {
			return fmt.Errorf("resetting the journal of sandbox %s: tree %s: %w", sandbox, root.Short(), err)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	old := j.sbs[sandbox]
	sj := &sandboxJournal{idx: m, rootSet: make(map[delta.ID]*treeEntry, len(m)), root: root, depth: depth, files: files, rootSeq: j.seq}
	if old != nil {
		sj.gen = old.gen + 1
		for _, te := range old.recent {
			te.req = nil
		}
	}
	for conv, te := range m {
		sj.rootSet[conv] = te
	}
	j.sbs[sandbox] = sj
	j.arm(sandbox, mapKeys(m))
	return nil
}

// loadJournal reads a journal tree's chain (docs/FORMAT.md, "Model-call
// journal") and indexes it by conversation, the newest tree's entry
// winning.
func loadJournal(ctx context.Context, load delta.BlobLoader, root delta.ID) (map[delta.ID]*treeEntry, int, int, error) {
	m := map[delta.ID]*treeEntry{}
	var levels []*journalLevel
	files := 0
	for id := &root; id != nil; {
		if len(levels) >= MaxJournalDepth {
			return nil, 0, 0, fmt.Errorf("a chain of more than %d trees: %w", MaxJournalDepth, errdefs.ErrCorrupt)
		}
		t, err := delta.LoadTree(ctx, load, *id)
		if err != nil {
			return nil, 0, 0, err
		}
		lvl, prev, err := journalLevelOf(t)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("tree %s: %w", id.Short(), err)
		}
		if files += len(lvl.names); files > MaxJournalEntries {
			return nil, 0, 0, fmt.Errorf("more than %d entries: %w", MaxJournalEntries, errdefs.ErrCorrupt)
		}
		if len(levels) > 0 {
			levels[len(levels)-1].older = lvl
		}
		levels = append(levels, lvl)
		for _, te := range lvl.names {
			if m[te.conv] == nil {
				m[te.conv] = te
			}
		}
		id = prev
	}
	return m, len(levels), files, nil
}

// journalLevelOf checks one tree of a journal's chain: entries named
// <conversation>.<turn>, plain 0600 files, each conversation once, and at
// most one directory "prev" (the older tree), which a tree holding no
// entry may not have.
func journalLevelOf(t *delta.Tree) (*journalLevel, *delta.ID, error) {
	if len(t.Entries) > MaxJournalEntries+1 {
		return nil, nil, fmt.Errorf("%d entries, over the limit %d: %w", len(t.Entries), MaxJournalEntries, errdefs.ErrCorrupt)
	}
	lvl := &journalLevel{names: make(map[string]*treeEntry, len(t.Entries))}
	seen := make(map[delta.ID]bool, len(t.Entries))
	var prev *delta.ID
	for _, e := range t.Entries {
		if e.Name == journalPrev {
			if e.Type != delta.TypeDir || e.Mode != 0o700 || e.UID != 0 || e.GID != 0 || e.MtimeNs != 0 || len(e.Xattrs) != 0 || e.Opaque {
				return nil, nil, fmt.Errorf("entry %s is not a plain 0700 directory: %w", journalPrev, errdefs.ErrCorrupt)
			}
			id := e.Subtree
			prev = &id
			continue
		}
		conv, turn, ok := parseJournalFileName(e.Name)
		switch {
		case !ok:
			return nil, nil, fmt.Errorf("entry %q is not named <conversation>.<turn>: %w", e.Name, errdefs.ErrCorrupt)
		case e.Type != delta.TypeFile || e.Mode != 0o600 || e.UID != 0 || e.GID != 0 || e.MtimeNs != 0 || len(e.Xattrs) != 0:
			return nil, nil, fmt.Errorf("entry %s is not a plain 0600 file: %w", e.Name, errdefs.ErrCorrupt)
		case e.Size > MaxEntry:
			return nil, nil, fmt.Errorf("entry %s: %d bytes, over the limit %d: %w", e.Name, e.Size, MaxEntry, errdefs.ErrCorrupt)
		case uint64(len(e.Chunks)) > e.Size/delta.ChunkMin+2:
			return nil, nil, fmt.Errorf("entry %s: %d chunks for %d bytes: %w", e.Name, len(e.Chunks), e.Size, errdefs.ErrCorrupt)
		case seen[conv]:
			return nil, nil, fmt.Errorf("conversation %s twice: %w", conv.Short(), errdefs.ErrCorrupt)
		}
		seen[conv] = true
		f := e
		f.Chunks = append([]delta.ID(nil), e.Chunks...)
		lvl.names[e.Name] = &treeEntry{conv: conv, turn: turn, file: f, scope: lvl}
	}
	if prev != nil && len(lvl.names) == 0 {
		return nil, nil, fmt.Errorf("a tree with only %s: %w", journalPrev, errdefs.ErrCorrupt)
	}
	return lvl, prev, nil
}
