package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// Object names in the store besides packs (docs/FORMAT.md, "Store layout").
// Records and packs are content-addressed and immutable; sandbox descriptions
// and refs are the few small mutable objects, rewritten whole.
const (
	recordPrefix  = "records/"
	sandboxPrefix = "sandboxes/"
	headPrefix    = "refs/heads/"
	tagPrefix     = "refs/tags/"
)

// maxSmallObject bounds what a reader accepts for a ref or a sandbox
// description (docs/FORMAT.md, "Limits").
const maxSmallObject = 64 << 10

func recordName(id delta.ID) string  { return recordPrefix + id.String() }
func sandboxName(name string) string { return sandboxPrefix + name }
func refName(r catalog.RefKind, name string) string {
	if r == catalog.RefTag {
		return tagPrefix + name
	}
	return headPrefix + name
}

// putRecord writes a checkpoint record; its name is its hash.
func (e *Engine) putRecord(ctx context.Context, cp *catalog.Checkpoint) error {
	data, id, err := catalog.EncodeRecord(cp)
	if err != nil {
		return err
	}
	cp.ID = id
	if err := upload.PutBytes(ctx, e.store, recordName(id), data); err != nil {
		return fmt.Errorf("checkpoint %s: write record: %w", id.Short(), err)
	}
	return nil
}

func (e *Engine) putSandboxObject(ctx context.Context, sb *catalog.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	if err := upload.PutBytes(ctx, e.store, sandboxName(sb.Name), data); err != nil {
		return fmt.Errorf("sandbox %s: write description: %w", sb.Name, err)
	}
	return nil
}

func (e *Engine) putRefObject(ctx context.Context, kind catalog.RefKind, name string, id delta.ID) error {
	if err := upload.PutBytes(ctx, e.store, refName(kind, name), []byte(id.String()+"\n")); err != nil {
		return fmt.Errorf("%s %s: write ref: %w", kind, name, err)
	}
	return nil
}

func parseRefObject(data []byte) (delta.ID, error) {
	return delta.ParseID(strings.TrimSpace(string(data)))
}
