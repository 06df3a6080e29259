package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/upload"
)

// putRecord writes a checkpoint record; its name is its hash.
func putRecord(ctx context.Context, store upload.Store, cp *delta.Checkpoint) error {
	data, id, err := delta.EncodeRecord(cp)
	if err != nil {
		return err
	}
	cp.ID = id
	if err := upload.PutBytes(ctx, store, delta.RecordName(id), data); err != nil {
		return fmt.Errorf("checkpoint %s: write record: %w", id.Short(), err)
	}
	return nil
}

func putSandboxObject(ctx context.Context, store upload.Store, sb *delta.Sandbox) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	if err := upload.PutBytes(ctx, store, delta.SandboxObject(sb.Key()), data); err != nil {
		return fmt.Errorf("sandbox %s: write description: %w", sb.Name, err)
	}
	return nil
}

// putRefObject writes a ref object; a head's name is its sandbox's Key.
func putRefObject(ctx context.Context, store upload.Store, kind delta.RefKind, name string, id delta.ID) error {
	if err := upload.PutBytes(ctx, store, delta.RefName(kind, name), delta.EncodeRef(id)); err != nil {
		return fmt.Errorf("%s %s: write ref: %w", kind, name, err)
	}
	return nil
}
