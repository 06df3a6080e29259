package catalog

import (
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// PutSandbox creates or replaces the sandbox's entry. Created is stored in
// UTC. To create exclusively, check Sandbox first in the same Update: the
// transaction conflicts if another writer creates it in between.
func (tx *Tx) PutSandbox(sb *delta.Sandbox) error {
	if sb == nil {
		return fmt.Errorf("put sandbox: nil sandbox: %w", errdefs.ErrInvalid)
	}
	if err := sb.Validate(); err != nil {
		return fmt.Errorf("put sandbox: %v: %w", err, errdefs.ErrInvalid)
	}
	s := *sb
	s.Created = s.Created.UTC()
	return tx.setJSON(sandboxKey(s.Name), &s, "sandbox "+string(s.Name))
}

// Sandbox returns the named sandbox's entry.
func (tx *Tx) Sandbox(name delta.SandboxName) (*delta.Sandbox, error) {
	if !delta.ValidRefName(string(name)) {
		return nil, fmt.Errorf("sandbox %q: name is not valid: %w", name, errdefs.ErrInvalid)
	}
	sb := new(delta.Sandbox)
	found, err := tx.getJSON(sandboxKey(name), sb, "sandbox "+string(name))
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("sandbox %s: %w", name, errdefs.ErrNotFound)
	}
	return sb, nil
}

// Sandboxes returns every sandbox, in name order.
func (tx *Tx) Sandboxes() ([]*delta.Sandbox, error) {
	var out []*delta.Sandbox
	err := tx.scan([]byte{prefixSandbox}, true, func(key, val []byte) error {
		sb := new(delta.Sandbox)
		if err := unmarshal(val, sb); err != nil {
			return fmt.Errorf("sandbox %s: %w", key[1:], err)
		}
		out = append(out, sb)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// SandboxNames returns every sandbox's name, in name order, without
// decoding the entries (a pass that needs only the names, such as frozen
// layer retention's after every freeze, is then a key scan).
func (tx *Tx) SandboxNames() ([]delta.SandboxName, error) {
	var out []delta.SandboxName
	err := tx.scan([]byte{prefixSandbox}, false, func(key, _ []byte) error {
		out = append(out, delta.SandboxName(key[1:]))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// DeleteSandbox removes the sandbox's entry only: its checkpoints, head ref
// and blobs are the caller's to remove (or keep, for branches made from it).
func (tx *Tx) DeleteSandbox(name delta.SandboxName) error {
	if _, err := tx.Sandbox(name); err != nil {
		return err
	}
	return tx.del(sandboxKey(name), "sandbox "+string(name))
}

// SetRef points a ref at a checkpoint, replacing any previous target. The
// target must be in the catalog, so resolving a ref never yields an ID that
// Checkpoint cannot find.
func (tx *Tx) SetRef(r delta.Ref) error {
	if err := checkRefName(r.Kind, r.Name); err != nil {
		return err
	}
	has, err := tx.has(checkpointKey(r.Target))
	if err != nil {
		return fmt.Errorf("ref %s: %w", r, err)
	}
	if !has {
		return fmt.Errorf("ref %s: target checkpoint %s: %w", r, r.Target, errdefs.ErrNotFound)
	}
	return tx.setJSON(refKey(r.Kind, r.Name), refValue{Target: r.Target}, "ref "+r.String())
}

// GetRef returns the checkpoint a ref points at.
func (tx *Tx) GetRef(kind delta.RefKind, name string) (delta.ID, error) {
	if err := checkRefName(kind, name); err != nil {
		return delta.ID{}, err
	}
	var v refValue
	what := "ref " + delta.Ref{Kind: kind, Name: name}.String()
	found, err := tx.getJSON(refKey(kind, name), &v, what)
	if err != nil {
		return delta.ID{}, err
	}
	if !found {
		return delta.ID{}, fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	}
	return v.Target, nil
}

// Refs returns every ref of kind, in name order.
func (tx *Tx) Refs(kind delta.RefKind) ([]delta.Ref, error) {
	if !kind.Known() {
		return nil, fmt.Errorf("ref kind %q: %w", kind, errdefs.ErrInvalid)
	}
	prefix := refPrefix(kind)
	var out []delta.Ref
	err := tx.scan(prefix, true, func(key, val []byte) error {
		r := delta.Ref{Kind: kind, Name: string(key[len(prefix):])}
		var v refValue
		if err := unmarshal(val, &v); err != nil {
			return fmt.Errorf("ref %s: %w", r, err)
		}
		r.Target = v.Target
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s refs: %w", kind, err)
	}
	return out, nil
}

// Head returns the head of the sandbox labelled name (the catalog keys
// heads by name; the store by SandboxKey, delta.HeadObject).
func (tx *Tx) Head(name delta.SandboxName) (delta.ID, error) {
	return tx.GetRef(delta.RefHead, string(name))
}

// HeadRef is the catalog's head ref of the sandbox labelled name pointing
// at id, for SetRef.
func HeadRef(name delta.SandboxName, id delta.ID) delta.Ref {
	return delta.Ref{Kind: delta.RefHead, Name: string(name), Target: id}
}

// DeleteHead removes the head of the sandbox labelled name.
func (tx *Tx) DeleteHead(name delta.SandboxName) error {
	return tx.DeleteRef(delta.RefHead, string(name))
}

// DeleteRef removes a ref; the checkpoint it pointed at is untouched.
func (tx *Tx) DeleteRef(kind delta.RefKind, name string) error {
	if _, err := tx.GetRef(kind, name); err != nil {
		return err
	}
	return tx.del(refKey(kind, name), "ref "+delta.Ref{Kind: kind, Name: name}.String())
}

// removedOwnKey keeps the key of a sandbox this home created and removed:
// its checkpoints stay (branches may need them) and remain this home's to
// prune. A rebuild forgets these notes, which only makes prune keep more.
//
//	0x00 "removed-own/" key → empty
func removedOwnKey(key delta.SandboxKey) []byte {
	return append([]byte{prefixMeta}, "removed-own/"+string(key)...)
}

// NoteRemovedOwnSandbox records that the sandbox with key (id, or legacy
// name) was created on this home and removed.
func (tx *Tx) NoteRemovedOwnSandbox(key delta.SandboxKey) error {
	return tx.set(removedOwnKey(key), nil, "removed sandbox "+string(key))
}

// RemovedOwnSandboxes lists the keys noted by NoteRemovedOwnSandbox.
func (tx *Tx) RemovedOwnSandboxes() ([]delta.SandboxKey, error) {
	prefix := removedOwnKey("")
	var out []delta.SandboxKey
	err := tx.scan(prefix, false, func(key, _ []byte) error {
		out = append(out, delta.SandboxKey(key[len(prefix):]))
		return nil
	})
	return out, err
}
