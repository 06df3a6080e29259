package catalog

// Key schema, version 1 (SchemaVersion).
//
// Every key starts with one prefix byte naming its kind, so each kind is one
// contiguous key range and every listing is a prefix scan. IDs are the raw 32
// bytes of a delta.ID (not hex): fixed width, so composite keys need no
// separators after them. Names (sandbox, ref) are ValidName strings, which
// never contain 0x00, so 0x00 ends a name inside a composite key and a scan of
// "a\x00" can never run into "ab\x00...". Values are JSON unless noted.
//
//	0x00 "schema"                              → JSON int: the schema version
//	0x01 id                                    → checkpoint record bytes, verbatim
//	                                             (delta.Hash(value) == id)
//	0x02 parent-id child-id                    → empty; lineage edge. Root
//	                                             checkpoints use the zero ID as
//	                                             parent, so Children(zero) lists roots
//	0x03 sandbox 0x00 created(8) id            → empty; a sandbox's checkpoints in
//	                                             creation order. created is the
//	                                             record's Created as UnixNano,
//	                                             big-endian with the sign bit
//	                                             flipped so it sorts numerically
//	0x04 sandbox                               → JSON Sandbox
//	0x05 kind 0x00 name                        → JSON {"target": hex id}; kind is
//	                                             the RefKind string ("head", "tag")
//	0x06 id                                    → JSON BlobLocation
//	0x07 id                                    → JSON int64 reference count; absent
//	                                             means zero (a count reaching zero
//	                                             deletes its key)
//	0x08 sandbox 0x00 seq(8)                   → JSON PendingUpload: the remote
//	                                             upload queue (see uploads.go)
//	0x00 "uploadseq"                           → decimal: last queue seq handed out
//
// The index keys (0x02, 0x03) are derived from the record, so DeleteCheckpoint
// recomputes them from the stored record rather than keeping a reverse index.
//
// Changing any of this means bumping SchemaVersion: Open refuses a catalog
// whose schema it does not know rather than misread it, and since the catalog
// is only an index, the remedy for an old catalog is a rebuild from the store.

import (
	"encoding/binary"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// SchemaVersion is the key schema this package reads and writes.
const SchemaVersion = 1

const (
	prefixMeta       byte = 0x00
	prefixCheckpoint byte = 0x01
	prefixChild      byte = 0x02
	prefixSandboxCP  byte = 0x03
	prefixSandbox    byte = 0x04
	prefixRef        byte = 0x05
	prefixBlob       byte = 0x06
	prefixRefCount   byte = 0x07
)

const idLen = len(delta.ID{})

func schemaKey() []byte { return append([]byte{prefixMeta}, "schema"...) }

// idKey builds prefix||id, the shape of the record, blob and refcount keys.
func idKey(prefix byte, id delta.ID) []byte {
	k := make([]byte, 0, 1+idLen)
	k = append(k, prefix)
	return append(k, id[:]...)
}

func checkpointKey(id delta.ID) []byte { return idKey(prefixCheckpoint, id) }
func blobKey(id delta.ID) []byte       { return idKey(prefixBlob, id) }
func refCountKey(id delta.ID) []byte   { return idKey(prefixRefCount, id) }

// childPrefix is the scan prefix for all children of parent.
func childPrefix(parent delta.ID) []byte { return idKey(prefixChild, parent) }

func childKey(parent, child delta.ID) []byte {
	return append(childPrefix(parent), child[:]...)
}

// sandboxCPPrefix is the scan prefix for all checkpoints of one sandbox.
func sandboxCPPrefix(sandbox delta.SandboxKey) []byte {
	k := make([]byte, 0, 2+len(sandbox)+8+idLen)
	k = append(k, prefixSandboxCP)
	k = append(k, sandbox...)
	return append(k, 0)
}

func sandboxCPKey(sandbox delta.SandboxKey, created time.Time, id delta.ID) []byte {
	k := sandboxCPPrefix(sandbox)
	// Flipping the sign bit makes the unsigned big-endian order match the
	// signed order of UnixNano, so pre-1970 times (never expected, but
	// representable) still sort first instead of last.
	k = binary.BigEndian.AppendUint64(k, uint64(created.UnixNano())^(1<<63))
	return append(k, id[:]...)
}

// idFromSuffix returns the ID that ends key; every composite key ends in one.
func idFromSuffix(key []byte) (delta.ID, bool) {
	var id delta.ID
	if len(key) < idLen {
		return id, false
	}
	copy(id[:], key[len(key)-idLen:])
	return id, true
}

func sandboxKey(name delta.SandboxName) []byte { return append([]byte{prefixSandbox}, name...) }

func refPrefix(kind delta.RefKind) []byte {
	k := make([]byte, 0, 2+len(kind)+64)
	k = append(k, prefixRef)
	k = append(k, kind...)
	return append(k, 0)
}

func refKey(kind delta.RefKind, name string) []byte { return append(refPrefix(kind), name...) }
