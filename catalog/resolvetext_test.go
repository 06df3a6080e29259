package catalog

import "github.com/turnsnap/turnsnap/delta"

// resolveText parses what a user typed and resolves it, as an edge does
// (ParseCheckpointRef, then ResolveRef), for tests that state references
// as text.
func resolveText(tx *Tx, sandbox delta.SandboxName, s string) (delta.ID, error) {
	r, err := ParseCheckpointRef(s)
	if err != nil {
		return delta.ID{}, err
	}
	return tx.ResolveRef(sandbox, r)
}
