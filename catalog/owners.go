package catalog

import "github.com/turnsnap/turnsnap/delta"

// Owners: which home may write a sandbox's head in a shared bucket, as far
// as this home knows (docs/STORAGE.md, "Ownership and fencing"). Absent, the
// owner is the home in the sandbox's description, epoch 0. An entry is
// written when this home adopts a sandbox, learns from the bucket that
// another home adopted one (it is then fenced), or rebuilds from heads
// that carry owner lines. The bucket's head stays the truth: the entry only
// lets a home refuse locally what the bucket would refuse at push.
//
//	0x00 "owner/" key → JSON delta.Owner
func ownerKey(key delta.SandboxKey) []byte {
	return append([]byte{prefixMeta}, "owner/"+string(key)...)
}

// SandboxOwner returns the owner noted for the sandbox key, if any.
func (tx *Tx) SandboxOwner(key delta.SandboxKey) (delta.Owner, bool, error) {
	var o delta.Owner
	found, err := tx.getJSON(ownerKey(key), &o, "owner of sandbox "+string(key))
	return o, found, err
}

// SetSandboxOwner notes the owner of the sandbox key.
func (tx *Tx) SetSandboxOwner(key delta.SandboxKey, o delta.Owner) error {
	return tx.setJSON(ownerKey(key), o, "owner of sandbox "+string(key))
}

// DeleteSandboxOwner forgets the owner noted for key (the sandbox is gone
// from this home).
func (tx *Tx) DeleteSandboxOwner(key delta.SandboxKey) error {
	return tx.del(ownerKey(key), "owner of sandbox "+string(key))
}

// Fenced checkpoints: committed here on a sandbox another home had adopted,
// so their head was refused by the bucket. Their records may be in the
// bucket, but they are on no head there: they are never remotely durable
// as turns of that sandbox (branch them to keep them).
//
//	0x00 "fenced/" id(32) → empty
func fencedKey(id delta.ID) []byte {
	return append([]byte{prefixMeta}, append([]byte("fenced/"), id[:]...)...)
}

// NoteFenced records that checkpoint id's head was refused by a fence.
func (tx *Tx) NoteFenced(id delta.ID) error {
	return tx.set(fencedKey(id), nil, "fenced checkpoint "+id.Short())
}

// IsFenced reports whether NoteFenced recorded checkpoint id.
func (tx *Tx) IsFenced(id delta.ID) (bool, error) { return tx.has(fencedKey(id)) }

// FencedCheckpoints lists the checkpoints noted by NoteFenced.
func (tx *Tx) FencedCheckpoints() ([]delta.ID, error) {
	prefix := append([]byte{prefixMeta}, "fenced/"...)
	var out []delta.ID
	err := tx.scan(prefix, false, func(key, _ []byte) error {
		var id delta.ID
		if len(key) == len(prefix)+len(id) {
			copy(id[:], key[len(prefix):])
			out = append(out, id)
		}
		return nil
	})
	return out, err
}
