package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Tx is one catalog transaction, handed to the function given to View or
// Update. It is valid only while that function runs and is not safe for
// concurrent use. Writes on a View Tx fail.
type Tx struct {
	ctx     context.Context
	txn     *badger.Txn
	records *recordCache  // the catalog's decoded records (record_cache.go)
	written *atomic.Int64 // the catalog's count of bytes written (Reserve); nil: read-only
}

// scanPage bounds how many keys one iterator pass collects before it is
// closed. Iterators are never held open across caller code or other reads,
// so callbacks may use the Tx freely (even write), and memory stays bounded.
const scanPage = 256

// scan calls fn with each key that has prefix, in key order, and optionally
// its value (copied). Keys and values are safe to keep.
func (tx *Tx) scan(prefix []byte, values bool, fn func(key, val []byte) error) error {
	start := prefix
	for {
		if err := tx.ctx.Err(); err != nil {
			return err
		}
		type kv struct{ k, v []byte }
		page := make([]kv, 0, scanPage)
		opt := badger.DefaultIteratorOptions
		opt.Prefix = prefix
		opt.PrefetchValues = values
		opt.PrefetchSize = scanPage
		it := tx.txn.NewIterator(opt)
		var err error
		for it.Seek(start); it.ValidForPrefix(prefix) && len(page) < scanPage; it.Next() {
			item := it.Item()
			e := kv{k: item.KeyCopy(nil)}
			if values {
				if e.v, err = item.ValueCopy(nil); err != nil {
					break
				}
			}
			page = append(page, e)
		}
		it.Close()
		if err != nil {
			return err
		}
		for _, e := range page {
			if err := fn(e.k, e.v); err != nil {
				return err
			}
		}
		if len(page) < scanPage {
			return nil
		}
		// Resume just after the last key seen: the smallest key greater than
		// it is the key with a zero byte appended.
		start = append(bytes.Clone(page[len(page)-1].k), 0)
	}
}

// isEmpty reports whether the database holds no keys at all.
func (tx *Tx) isEmpty() bool {
	opt := badger.DefaultIteratorOptions
	opt.PrefetchValues = false
	it := tx.txn.NewIterator(opt)
	defer it.Close()
	it.Rewind()
	return !it.Valid()
}

// get returns a copy of key's value, or found=false.
func (tx *Tx) get(key []byte) (val []byte, found bool, err error) {
	item, err := tx.txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	val, err = item.ValueCopy(nil)
	return val, err == nil, err
}

func (tx *Tx) has(key []byte) (bool, error) {
	_, err := tx.txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}

// getJSON decodes key's value into v. what names the entry for errors.
func (tx *Tx) getJSON(key []byte, v any, what string) (bool, error) {
	data, found, err := tx.get(key)
	if err != nil || !found {
		if err != nil {
			err = fmt.Errorf("%s: %w", what, err)
		}
		return false, err
	}
	if err := unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return true, nil
}

func (tx *Tx) set(key, val []byte, what string) error {
	if err := tx.txn.Set(key, val); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	tx.count(len(key) + len(val))
	return nil
}

// count adds a write of n bytes to the catalog's count (Reserve). A
// transaction that then fails was counted anyway: the count only ever
// errs towards more reserve.
func (tx *Tx) count(n int) {
	if tx.written != nil {
		tx.written.Add(int64(n + entryOverhead))
	}
}

func (tx *Tx) setJSON(key []byte, v any, what string) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: encode: %w", what, err)
	}
	return tx.set(key, data, what)
}

func (tx *Tx) del(key []byte, what string) error {
	if err := tx.txn.Delete(key); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	tx.count(len(key))
	return nil
}

// PutCheckpoint indexes cp: its record, the parent→child edge and the
// sandbox→checkpoint entry. The record is encoded here (EncodeRecord) and
// cp.ID set to its hash; a non-zero cp.ID that differs is ErrInvalid. The
// parent need not be in the catalog, so a rebuild may add records in any
// order; Ancestors reports a missing one.
func (tx *Tx) PutCheckpoint(cp *delta.Checkpoint) error {
	data, id, err := delta.EncodeRecord(cp)
	if err != nil {
		return err
	}
	if !cp.ID.IsZero() && cp.ID != id {
		return fmt.Errorf("checkpoint %s: record hashes to %s: %w", cp.ID, id, errdefs.ErrInvalid)
	}
	what := "checkpoint " + id.String()
	exists, err := tx.has(checkpointKey(id))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if exists {
		return fmt.Errorf("%s: %w", what, errdefs.ErrExists)
	}
	if err := tx.set(checkpointKey(id), data, what); err != nil {
		return err
	}
	if err := tx.set(childKey(cp.Parent, id), nil, what); err != nil {
		return err
	}
	if err := tx.set(sandboxCPKey(cp.SandboxKey(), cp.Created, id), nil, what); err != nil {
		return err
	}
	cp.ID = id
	return nil
}

// Checkpoint returns the record of id, verified against its hash.
func (tx *Tx) Checkpoint(id delta.ID) (*delta.Checkpoint, error) {
	data, found, err := tx.get(checkpointKey(id))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if !found {
		return nil, fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	if cp := tx.records.get(id, data); cp != nil {
		return cp, nil
	}
	cp, err := delta.DecodeRecord(id, data)
	if err != nil {
		return nil, err
	}
	tx.records.put(id, data, cp)
	return cp, nil
}

// Children returns the checkpoints whose parent is id, in ID order. The zero
// ID's children are the root checkpoints (those created from a base).
func (tx *Tx) Children(id delta.ID) ([]delta.ID, error) {
	var out []delta.ID
	err := tx.scan(childPrefix(id), false, func(key, _ []byte) error {
		child, _ := idFromSuffix(key)
		out = append(out, child)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: children: %w", id, err)
	}
	return out, nil
}

// Ancestors returns id's record followed by its parent's, grandparent's and so
// on to the root, at most limit records (limit <= 0: all). A parent missing
// from the catalog is ErrNotFound naming both checkpoints.
func (tx *Tx) Ancestors(id delta.ID, limit int) ([]*delta.Checkpoint, error) {
	var out []*delta.Checkpoint
	seen := make(map[delta.ID]bool)
	var child delta.ID // the record whose Parent cur is; zero for id itself
	for cur := id; !cur.IsZero() && (limit <= 0 || len(out) < limit); {
		if err := tx.ctx.Err(); err != nil {
			return nil, fmt.Errorf("checkpoint %s: ancestors: %w", id, err)
		}
		if seen[cur] {
			// Impossible with honest hashes (a parent's ID is inside the
			// child's record), so a cycle means the index is damaged.
			return nil, fmt.Errorf("checkpoint %s: lineage cycle at %s: %w", id, cur, errdefs.ErrCorrupt)
		}
		seen[cur] = true
		cp, err := tx.Checkpoint(cur)
		if err != nil {
			if !child.IsZero() {
				return nil, fmt.Errorf("checkpoint %s: parent of %s: %w", id, child, err)
			}
			return nil, err
		}
		out = append(out, cp)
		child, cur = cur, cp.Parent
	}
	return out, nil
}

// SandboxCheckpoints returns the sandbox's checkpoints in creation order (ties
// broken by ID). A sandbox with none, or unknown to the catalog, gives none.
// Checkpoints are indexed by their sandbox's key (its id; a legacy sandbox's
// name), so the label sandbox is resolved through the sandbox's entry; a
// label with no entry (a removed sandbox) is taken as a legacy key.
func (tx *Tx) SandboxCheckpoints(sandbox delta.SandboxName) ([]*delta.Checkpoint, error) {
	if !delta.ValidRefName(string(sandbox)) {
		return nil, fmt.Errorf("sandbox %q: name is not valid: %w", sandbox, errdefs.ErrInvalid)
	}
	key := delta.SandboxKey(sandbox)
	sb := new(delta.Sandbox)
	if found, err := tx.getJSON(sandboxKey(sandbox), sb, "sandbox "+string(sandbox)); err != nil {
		return nil, err
	} else if found {
		key = sb.Key()
	}
	return tx.checkpointsByKey(string(sandbox), key)
}

// SandboxKeyCheckpoints returns the checkpoints of the sandbox whose key
// (id, or legacy name) is key, in creation order.
func (tx *Tx) SandboxKeyCheckpoints(key delta.SandboxKey) ([]*delta.Checkpoint, error) {
	return tx.checkpointsByKey(string(key), key)
}

func (tx *Tx) checkpointsByKey(sandbox string, key delta.SandboxKey) ([]*delta.Checkpoint, error) {
	var ids []delta.ID
	err := tx.scan(sandboxCPPrefix(key), false, func(key, _ []byte) error {
		id, _ := idFromSuffix(key)
		ids = append(ids, id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: checkpoints: %w", sandbox, err)
	}
	out := make([]*delta.Checkpoint, 0, len(ids))
	for _, id := range ids {
		cp, err := tx.Checkpoint(id)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", sandbox, err)
		}
		out = append(out, cp)
	}
	return out, nil
}

// ForEachCheckpoint calls fn with every checkpoint, in ID order, stopping at
// the first error. fn may use the Tx, including writing through it.
func (tx *Tx) ForEachCheckpoint(fn func(*delta.Checkpoint) error) error {
	return tx.scan([]byte{prefixCheckpoint}, true, func(key, val []byte) error {
		id, _ := idFromSuffix(key)
		cp, err := delta.DecodeRecord(id, val)
		if err != nil {
			return err
		}
		return fn(cp)
	})
}

// DeleteCheckpoint removes id's record and its index entries. It does not
// look at children, refs or refcounts: deciding what may go is the caller's
// job (a child left behind makes Ancestors fail at the gap).
func (tx *Tx) DeleteCheckpoint(id delta.ID) error {
	cp, err := tx.Checkpoint(id)
	if err != nil {
		return err
	}
	what := "checkpoint " + id.String()
	for _, k := range [][]byte{checkpointKey(id), childKey(cp.Parent, id), sandboxCPKey(cp.SandboxKey(), cp.Created, id)} {
		if err := tx.del(k, what); err != nil {
			return err
		}
	}
	return nil
}
