// Package btrfs owns btrfs sandbox roots: each sandbox is a writable
// snapshot of a read-only base subvolume, each committed checkpoint leaves a
// read-only snapshot as a local restore point, and the changes of a turn are
// found from btrfs generation numbers (the tree-search ioctl, as `btrfs
// subvolume find-new` uses it), so that a checkpoint costs O(change), not
// O(tree). A root records the same tree format as an overlay root, so any
// backend restores any checkpoint. docs/BTRFS.md explains the design.
//
// Layout, under a pool directory on a mounted btrfs filesystem:
//
//	POOL/bases/TREE/root           read-only subvolume: a base, shared
//	POOL/bases/TREE/info.json      its tree and generation
//	POOL/sandboxes/SID/info.json   the sandbox's base
//	POOL/sandboxes/SID/current     symlink to the live generation "gen-N"
//	POOL/sandboxes/SID/gen-N/live  writable subvolume: the sandbox's root
//	POOL/sandboxes/SID/gen-N/meta  writable subvolume: the last scan's records
//	POOL/sandboxes/SID/snaps/TREE/ a restore point: read-only root and meta
//	                               snapshots and info.json
//
// and in the sandbox directory the engine chose:
//
//	DIR/root   bind mount of the live subvolume (noatime), the sandbox's root
//	DIR/pool   symlink to POOL/sandboxes/SID
//
// Every change to the pool is staged (a temp name, then a rename; a removed
// restore point is put back if its replacement fails), so a crash leaves the
// old state or the new one; leftovers are cleared on the next mount.
//
// btrfs is driven through ioctls only (golang.org/x/sys/unix), never the CLI.
package btrfs
