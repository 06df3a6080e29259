package llmproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Objects is the part of an object store the journal needs; upload.Store
// satisfies it.
type Objects interface {
	Put(ctx context.Context, name string, r io.Reader, size int64) error
	Get(ctx context.Context, name string) (io.ReadCloser, error)
}

// MaxEntry bounds one journal entry's plaintext (request plus reply): a
// model exchange is at most a few MiB; the bound keeps a corrupt or hostile
// object from exhausting memory.
const MaxEntry = 64 << 20

// entryMagic starts every entry's plaintext; the digit is the version.
const entryMagic = "TSJ1"

// JournalName is the object name of the entry whose plaintext hashes to id.
func JournalName(id delta.ID) string {
	s := id.String()
	return "journal/" + s[:2] + "/" + s
}

// StoreJournal is a Journal over an object store. Entries are immutable
// objects named by the BLAKE3 hash of their plaintext and stored
// zstd-compressed (JournalName); the per-sandbox index of which entries are
// current lives in memory and is what a checkpoint references (Refs) and a
// restore brings back (Reset).
type StoreJournal struct {
	store Objects
	enc   *zstd.Encoder
	dec   *zstd.Decoder

	mu  sync.Mutex
	idx map[string]map[delta.ID]journalRef // sandbox → conversation → entry
	reruns
}

type journalRef struct {
	obj  delta.ID
	turn int
}

// NewStoreJournal returns an empty journal writing to store.
func NewStoreJournal(store Objects) (*StoreJournal, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(MaxEntry), zstd.WithDecoderConcurrency(0))
	if err != nil {
		return nil, err
	}
	return &StoreJournal{store: store, enc: enc, dec: dec, idx: map[string]map[delta.ID]journalRef{}}, nil
}

// Put stores e and makes it sandbox's entry for e.Conv.
func (j *StoreJournal) Put(ctx context.Context, sandbox string, e *Entry) error {
	plain, err := encodeEntry(e)
	if err != nil {
		return fmt.Errorf("journal entry of sandbox %s: %w", sandbox, err)
	}
	id := delta.Hash(plain)
	packed := j.enc.EncodeAll(plain, nil)
	if err := j.store.Put(ctx, JournalName(id), bytes.NewReader(packed), int64(len(packed))); err != nil {
		return fmt.Errorf("journal entry %s of sandbox %s: %w", id.Short(), sandbox, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	m := j.idx[sandbox]
	if m == nil {
		m = map[delta.ID]journalRef{}
		j.idx[sandbox] = m
	}
	m[e.Conv] = journalRef{obj: id, turn: e.Turn}
	return nil
}

// Get returns sandbox's entry for conv, read from the store and verified.
func (j *StoreJournal) Get(ctx context.Context, sandbox string, conv delta.ID) (*Entry, error) {
	j.mu.Lock()
	r, ok := j.idx[sandbox][conv]
	j.mu.Unlock()
	if !ok {
		return nil, nil
	}
	e, err := j.Load(ctx, r.obj)
	if err != nil {
		return nil, err
	}
	if e.Conv != conv {
		return nil, fmt.Errorf("journal entry %s: holds conversation %s, indexed as %s: %w", r.obj.Short(), e.Conv.Short(), conv.Short(), errdefs.ErrCorrupt)
	}
	return e, nil
}

// Refs lists the entries sandbox's journal holds now, ordered by turn: what
// a checkpoint taken now references, so that restoring it brings them back.
func (j *StoreJournal) Refs(sandbox string) []delta.ID {
	j.mu.Lock()
	rs := make([]journalRef, 0, len(j.idx[sandbox]))
	for _, r := range j.idx[sandbox] {
		rs = append(rs, r)
	}
	j.mu.Unlock()
	sort.Slice(rs, func(a, b int) bool {
		if rs[a].turn != rs[b].turn {
			return rs[a].turn < rs[b].turn
		}
		return bytes.Compare(rs[a].obj[:], rs[b].obj[:]) < 0
	})
	ids := make([]delta.ID, len(rs))
	for i, r := range rs {
		ids[i] = r.obj
	}
	return ids
}

// Reset makes sandbox's journal exactly the entries refs (a restored
// checkpoint's references; nil empties it), reading and verifying each,
// and arms them for the sandbox's re-run. On error the journal is left as
// it was.
func (j *StoreJournal) Reset(ctx context.Context, sandbox string, refs []delta.ID) error {
	m := make(map[delta.ID]journalRef, len(refs))
	for _, id := range refs {
		e, err := j.Load(ctx, id)
		if err != nil {
			return fmt.Errorf("resetting the journal of sandbox %s: %w", sandbox, err)
		}
		m[e.Conv] = journalRef{obj: id, turn: e.Turn}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.idx[sandbox] = m
	j.arm(sandbox, mapKeys(m))
	return nil
}

func mapKeys[V any](m map[delta.ID]V) []delta.ID {
	ks := make([]delta.ID, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// Load reads entry id from the store and checks its hash.
func (j *StoreJournal) Load(ctx context.Context, id delta.ID) (*Entry, error) {
	rc, err := j.store.Get(ctx, JournalName(id))
	if err != nil {
		return nil, fmt.Errorf("journal entry %s: %w", id.Short(), err)
	}
	defer rc.Close()
	// zstd never expands incompressible input by more than a few bytes per
	// block, so a larger object cannot hold a valid entry.
	packed, err := io.ReadAll(io.LimitReader(rc, MaxEntry+MaxEntry/64+1<<10))
	if err != nil {
		return nil, fmt.Errorf("journal entry %s: %w", id.Short(), err)
	}
	plain, err := j.dec.DecodeAll(packed, nil)
	if err != nil {
		return nil, fmt.Errorf("journal entry %s: %v: %w", id.Short(), err, errdefs.ErrCorrupt)
	}
	if got := delta.Hash(plain); got != id {
		return nil, fmt.Errorf("journal entry %s: content hashes to %s: %w", id.Short(), got.Short(), errdefs.ErrCorrupt)
	}
	e, err := decodeEntry(plain)
	if err != nil {
		return nil, fmt.Errorf("journal entry %s: %w", id.Short(), err)
	}
	return e, nil
}

// entryHeader is the JSON header of an entry's plaintext.
type entryHeader struct {
	Conv            delta.ID `json:"conv"`
	Turn            int      `json:"turn"`
	Shape           Shape    `json:"shape"`
	Stream          bool     `json:"stream,omitempty"`
	Status          int      `json:"status"`
	ContentType     string   `json:"content_type,omitempty"`
	ContentEncoding string   `json:"content_encoding,omitempty"`
	// A delta entry ("TSJ2") stores only the bytes its request does not
	// share with an earlier turn's: its request is the first Prefix bytes
	// of the request of the entry named Base, then the entry's Req part,
	// then the last Suffix bytes of Base's request; Req hashes the whole.
	Base   string    `json:"base,omitempty"`
	Prefix int       `json:"prefix,omitempty"`
	Suffix int       `json:"suffix,omitempty"`
	Req    *delta.ID `json:"req,omitempty"`
}

// deltaMagic starts a delta entry's plaintext (entryHeader.Base); an entry
// whose request is whole keeps entryMagic, byte for byte as before deltas.
const deltaMagic = "TSJ2"

func headerOf(e *Entry) entryHeader {
	return entryHeader{Conv: e.Conv, Turn: e.Turn, Shape: e.Shape, Stream: e.Stream,
		Status: e.Status, ContentType: e.ContentType, ContentEncoding: e.ContentEncoding}
}

// encodeEntry lays out an entry's plaintext:
//
//	"TSJ1" || uvarint(len(H)) || H || uvarint(len(Req)) || Req || uvarint(len(Resp)) || Resp
//
// where H is the JSON entryHeader.
func encodeEntry(e *Entry) ([]byte, error) {
	return encodeParts(entryMagic, headerOf(e), e.Request, e.Response)
}

// encodeDelta lays out e as a delta against base, the whole request of the
// entry named h.Base: "TSJ2", then the same three parts, the request part
// holding only e.Request's bytes between the shared prefix and suffix.
func encodeDelta(e *Entry, baseName string, base []byte) ([]byte, error) {
	p, s := sharedEnds(base, e.Request)
	h := headerOf(e)
	req := delta.Hash(e.Request)
	h.Base, h.Prefix, h.Suffix, h.Req = baseName, p, s, &req
	return encodeParts(deltaMagic, h, e.Request[p:len(e.Request)-s], e.Response)
}

// sharedEnds returns the lengths of the longest common prefix of a and b
// and then of the longest common suffix of what remains of both.
func sharedEnds(a, b []byte) (prefix, suffix int) {
	n := min(len(a), len(b))
	for prefix < n && a[prefix] == b[prefix] {
		prefix++
	}
	for suffix < n-prefix && a[len(a)-1-suffix] == b[len(b)-1-suffix] {
		suffix++
	}
	return prefix, suffix
}

func encodeParts(magic string, h entryHeader, req, resp []byte) ([]byte, error) {
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	n := len(magic) + 3*binary.MaxVarintLen64 + len(hb) + len(req) + len(resp)
	if n > MaxEntry {
		return nil, fmt.Errorf("%d bytes, more than the limit of %d: %w", n, MaxEntry, errdefs.ErrInvalid)
	}
	b := make([]byte, 0, n)
	b = append(b, magic...)
	for _, part := range [][]byte{hb, req, resp} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b, nil
}

// decodeEntry parses a whole entry's plaintext ("TSJ1"); a delta entry
// needs its base (TreeJournal) and is refused here.
func decodeEntry(b []byte) (*Entry, error) {
	h, req, resp, err := decodeParts(b)
	if err != nil {
		return nil, err
	}
	if h.Base != "" {
		return nil, fmt.Errorf("a delta entry read without its base: %w", errdefs.ErrCorrupt)
	}
	return entryOf(h, bytes.Clone(req), bytes.Clone(resp)), nil
}

func entryOf(h entryHeader, req, resp []byte) *Entry {
	return &Entry{Conv: h.Conv, Turn: h.Turn, Shape: h.Shape, Stream: h.Stream, Status: h.Status,
		ContentType: h.ContentType, ContentEncoding: h.ContentEncoding, Request: req, Response: resp}
}

// decodeParts parses an entry's plaintext, whole or delta; every declared
// length is checked against the bytes that remain, and a delta's header
// against the rules of docs/FORMAT.md ("Model-call journal"). The parts
// alias b.
func decodeParts(b []byte) (h entryHeader, req, resp []byte, err error) {
	var magic string
	switch {
	case bytes.HasPrefix(b, []byte(entryMagic)):
		magic = entryMagic
	case bytes.HasPrefix(b, []byte(deltaMagic)):
		magic = deltaMagic
	default:
		return h, nil, nil, fmt.Errorf("not a journal entry (bad magic): %w", errdefs.ErrCorrupt)
	}
	b = b[len(magic):]
	var parts [3][]byte
	for i := range parts {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return h, nil, nil, fmt.Errorf("entry part %d: declared length exceeds the entry: %w", i, errdefs.ErrCorrupt)
		}
		parts[i] = b[k : k+int(n)]
		b = b[k+int(n):]
	}
	if len(b) != 0 {
		return h, nil, nil, fmt.Errorf("%d trailing bytes: %w", len(b), errdefs.ErrCorrupt)
	}
	if err := json.Unmarshal(parts[0], &h); err != nil {
		return h, nil, nil, fmt.Errorf("entry header: %v: %w", err, errdefs.ErrCorrupt)
	}
	if h.Status < 100 || h.Status > 999 {
		return h, nil, nil, fmt.Errorf("entry status %d: %w", h.Status, errdefs.ErrCorrupt)
	}
	if _, ok := convFields[h.Shape]; !ok {
		return h, nil, nil, fmt.Errorf("entry shape %q: %w", h.Shape, errdefs.ErrCorrupt)
	}
	if magic == entryMagic {
		if h.Base != "" || h.Prefix != 0 || h.Suffix != 0 || h.Req != nil {
			return h, nil, nil, fmt.Errorf("a whole entry with delta fields: %w", errdefs.ErrCorrupt)
		}
		return h, parts[1], parts[2], nil
	}
	_, bt, ok := parseJournalFileName(h.Base)
	switch {
	case !ok || bt < 0 || bt >= h.Turn:
		return h, nil, nil, fmt.Errorf("delta entry of turn %d: base %q is not an earlier turn's entry: %w", h.Turn, h.Base, errdefs.ErrCorrupt)
	case h.Prefix < 0 || h.Suffix < 0 || h.Prefix > MaxEntry || h.Suffix > MaxEntry || h.Req == nil:
		return h, nil, nil, fmt.Errorf("delta entry of turn %d: prefix %d, suffix %d, request hash %v: %w", h.Turn, h.Prefix, h.Suffix, h.Req != nil, errdefs.ErrCorrupt)
	}
	return h, parts[1], parts[2], nil
}
