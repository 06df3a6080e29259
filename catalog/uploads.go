package catalog

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// The upload queue: objects committed locally that the remote store does
// not hold yet. Entries are added in the same transaction that commits their
// checkpoint, so a committed checkpoint always has its uploads queued and a
// crash cannot lose them; an entry is removed only after its PUT succeeded.
//
//	0x08 sandbox 0x00 seq(8, big-endian) → JSON PendingUpload
//	0x00 "uploadseq"                     → decimal uint64: the last seq handed out
//
// Within a sandbox, entries are in commit order (packs, then the record,
// then refs), which uploads must follow so that the remote store never holds
// a record whose packs are missing.
const prefixUpload byte = 0x08

// PendingUpload is one object waiting for the remote store.
type PendingUpload struct {
	Seq        uint64   `json:"seq"`
	Sandbox    string   `json:"sandbox"`
	Checkpoint delta.ID `json:"checkpoint"`
	Name       string   `json:"name"`
	Size       int64    `json:"size"`
	// Delete asks for the object to be removed remotely (a removed
	// sandbox's description and head) instead of uploaded.
	Delete bool `json:"delete,omitempty"`
	// After names queued objects that must reach the remote store first:
	// a record waits for the packs it needs, a ref for its record.
	After []string `json:"after,omitempty"`
}

func uploadPrefix(sandbox string) []byte {
	k := []byte{prefixUpload}
	if sandbox == "" {
		return k
	}
	return append(append(k, sandbox...), 0)
}

func uploadKey(sandbox string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(uploadPrefix(sandbox), seq)
}

func uploadSeqKey() []byte { return append([]byte{prefixMeta}, "uploadseq"...) }

// EnqueueUploads queues objects for the remote store in the given order.
func (tx *Tx) EnqueueUploads(items []PendingUpload) error {
	if len(items) == 0 {
		return nil
	}
	var seq uint64
	v, found, err := tx.get(uploadSeqKey())
	if err != nil {
		return err
	}
	if found {
		if seq, err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return fmt.Errorf("upload queue sequence %q: %v: %w", v, err, errdefs.ErrCorrupt)
		}
	}
	for _, it := range items {
		if !delta.ValidRefName(it.Sandbox) || it.Name == "" {
			return fmt.Errorf("queue upload %q of sandbox %q: %w", it.Name, it.Sandbox, errdefs.ErrInvalid)
		}
		seq++
		it.Seq = seq
		if err := tx.setJSON(uploadKey(it.Sandbox, seq), &it, "upload "+it.Name); err != nil {
			return err
		}
	}
	return tx.set(uploadSeqKey(), []byte(strconv.FormatUint(seq, 10)), "upload queue sequence")
}

// PendingUploads lists queued uploads of one sandbox ("" for all), grouped
// by sandbox, each sandbox's in commit order.
func (tx *Tx) PendingUploads(sandbox string) ([]PendingUpload, error) {
	var out []PendingUpload
	err := tx.scan(uploadPrefix(sandbox), true, func(_, val []byte) error {
		var p PendingUpload
		if err := json.Unmarshal(val, &p); err != nil {
			return fmt.Errorf("queued upload: %v: %w", err, errdefs.ErrCorrupt)
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// UploadDone removes a queued upload once the remote store holds it.
func (tx *Tx) UploadDone(p PendingUpload) error {
	return tx.del(uploadKey(p.Sandbox, p.Seq), "upload "+p.Name)
}

// DequeueNames removes every queued upload of the named objects, in any
// sandbox's queue (objects that need no upload any more: a pruned record, a
// collected pack), in one scan of the queue. It returns how many entries
// it removed.
func (tx *Tx) DequeueNames(names map[string]bool) (int, error) {
	if len(names) == 0 {
		return 0, nil
	}
	var drop []PendingUpload
	err := tx.scan(uploadPrefix(""), true, func(_, val []byte) error {
		var p PendingUpload
		if err := json.Unmarshal(val, &p); err != nil {
			return fmt.Errorf("queued upload: %v: %w", err, errdefs.ErrCorrupt)
		}
		if names[p.Name] {
			drop = append(drop, p)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, p := range drop {
		if err := tx.UploadDone(p); err != nil {
			return 0, err
		}
	}
	return len(drop), nil
}
