package btrfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Item types of an fs tree that turnsnap reads (linux/btrfs_tree.h).
const inodeItemKey = 1

// searchBufSize holds a few hundred items per BTRFS_IOC_TREE_SEARCH_V2
// call, for searches that return many; smallSearchBufSize serves lookups
// and checks that stop at the first item.
const (
	searchBufSize      = 64 << 10
	smallSearchBufSize = 4 << 10
)

// inodeItem is the part of a btrfs_inode_item change detection needs.
type inodeItem struct {
	Gen     uint64 // transaction that created the inode
	Transid uint64 // last transaction that changed it (data, metadata, links)
	Nlink   uint32
	Mode    uint32
}

func parseInodeItem(b []byte) (inodeItem, bool) {
	if len(b) < 160 {
		return inodeItem{}, false
	}
	le := binary.LittleEndian
	return inodeItem{Gen: le.Uint64(b[0:]), Transid: le.Uint64(b[8:]), Nlink: le.Uint32(b[40:]), Mode: le.Uint32(b[52:])}, true
}

// searchKey is the range of one tree search: keys (objectid, type, offset)
// from min to max in key order, in leaves written in a transaction at or
// after minTransid. Leaves that were not rewritten since are skipped without
// being read, which is what makes finding changes cost O(change).
type searchKey struct {
	minObjectID, maxObjectID uint64
	minType, maxType         uint32
	minOffset, maxOffset     uint64
	minTransid               uint64
}

// treeSearch calls fn with every item in range k of the subvolume open as fd
// (tree id 0: the fd's own subvolume). fn returning errStop ends the search.
func treeSearch(fd int, k searchKey, bufSize int, fn func(objectID uint64, typ uint32, offset uint64, data []byte) error) error {
	buf := make([]byte, 112+bufSize)
	ne := binary.NativeEndian
	obj, typ, off := k.minObjectID, k.minType, k.minOffset
	for {
		clear(buf[:112])
		ne.PutUint64(buf[8:], obj)
		ne.PutUint64(buf[16:], k.maxObjectID)
		ne.PutUint64(buf[24:], off)
		ne.PutUint64(buf[32:], k.maxOffset)
		ne.PutUint64(buf[40:], k.minTransid)
		ne.PutUint64(buf[48:], math.MaxUint64)
		ne.PutUint32(buf[56:], typ)
		ne.PutUint32(buf[60:], k.maxType)
		ne.PutUint32(buf[64:], math.MaxUint32)
		ne.PutUint64(buf[104:], uint64(bufSize))
		err := ioctl(fd, iocTreeSearchV2, unsafe.Pointer(&buf[0]))
		runtime.KeepAlive(buf)
		if err != nil {
			return fmt.Errorf("tree search: %w", err)
		}
		n := int(ne.Uint32(buf[64:]))
		if n == 0 {
			return nil
		}
		items := buf[112:]
		for range n {
			if len(items) < 32 {
				return fmt.Errorf("tree search: truncated item header")
			}
			obj = ne.Uint64(items[8:])
			off = ne.Uint64(items[16:])
			typ = ne.Uint32(items[24:])
			l := int(ne.Uint32(items[28:]))
			if len(items) < 32+l {
				return fmt.Errorf("tree search: truncated item")
			}
			if err := fn(obj, typ, off, items[32:32+l]); err != nil {
				if errors.Is(err, errStop) {
					return nil
				}
				return err
			}
			items = items[32+l:]
		}
		// Continue after the last key returned.
		switch {
		case off < math.MaxUint64:
			off++
		case typ < math.MaxUint8:
			typ, off = typ+1, 0
		case obj < k.maxObjectID:
			obj, typ, off = obj+1, 0, 0
		default:
			return nil
		}
		if obj > k.maxObjectID || (obj == k.maxObjectID && typ > k.maxType) {
			return nil
		}
	}
}

var errStop = errors.New("stop search")

// changedInodes calls fn for every inode of the subvolume open as fd whose
// item changed in a transaction after since. Unchanged parts of the tree are
// never read: the search descends only into nodes rewritten after since.
func changedInodes(fd int, since uint64, fn func(ino uint64, it inodeItem) error) error {
	return searchInodes(fd, since, searchBufSize, fn)
}

func searchInodes(fd int, since uint64, bufSize int, fn func(ino uint64, it inodeItem) error) error {
	k := searchKey{
		minObjectID: firstFreeObjectID, maxObjectID: lastFreeObjectID,
		minType: inodeItemKey, maxType: inodeItemKey, maxOffset: math.MaxUint64,
		minTransid: since + 1,
	}
	return treeSearch(fd, k, bufSize, func(obj uint64, typ uint32, _ uint64, data []byte) error {
		if typ != inodeItemKey {
			return nil
		}
		it, ok := parseInodeItem(data)
		if !ok {
			return fmt.Errorf("inode %d: short inode item", obj)
		}
		if it.Transid <= since {
			return nil // an unchanged item in a rewritten leaf
		}
		return fn(obj, it)
	})
}

// lookupInode reads one inode's item.
func lookupInode(fd int, ino uint64) (inodeItem, error) {
	var it inodeItem
	found := false
	k := searchKey{minObjectID: ino, maxObjectID: ino, minType: inodeItemKey, maxType: inodeItemKey}
	err := treeSearch(fd, k, smallSearchBufSize, func(_ uint64, typ uint32, _ uint64, data []byte) error {
		if typ == inodeItemKey {
			it, found = parseInodeItem(data)
			return errStop
		}
		return nil
	})
	if err != nil {
		return it, fmt.Errorf("inode %d: %w", ino, err)
	}
	if !found {
		return it, fmt.Errorf("inode %d: no inode item: %w", ino, unix.ENOENT)
	}
	return it, nil
}

// Back-reference item types (linux/btrfs_tree.h): an inode's names, keyed
// by parent directory (INODE_REF) or by a hash of parent and name
// (INODE_EXTREF, for names beyond what one ref item holds).
const (
	inodeRefKey    = 12
	inodeExtrefKey = 13
)

// maxRefDepth bounds the directory depth refPaths climbs: a name is at
// least 2 bytes of path, so no real path is deeper than this.
const maxRefDepth = 1 << 16

// refPaths returns every path of inode ino, built from the back references
// of it and of the directories above it; dirs memoises directory paths.
func refPaths(fd int, ino uint64, dirs map[uint64]string, depth int) ([]string, error) {
	if ino == firstFreeObjectID {
		return []string{""}, nil
	}
	if depth > maxRefDepth {
		return nil, fmt.Errorf("paths of inode %d: deeper than %d directories", ino, maxRefDepth)
	}
	type ref struct {
		parent uint64
		name   string
	}
	var refs []ref
	ne := binary.LittleEndian
	k := searchKey{minObjectID: ino, maxObjectID: ino, minType: inodeRefKey, maxType: inodeExtrefKey, maxOffset: math.MaxUint64}
	err := treeSearch(fd, k, searchBufSize, func(_ uint64, typ uint32, off uint64, b []byte) error {
		for len(b) > 0 {
			var r ref
			var hdr int
			switch typ {
			case inodeRefKey: // u64 index, u16 name_len, name
				if len(b) < 10 {
					return fmt.Errorf("inode %d: short ref item", ino)
				}
				r.parent, hdr = off, 10
			case inodeExtrefKey: // u64 parent, u64 index, u16 name_len, name
				if len(b) < 18 {
					return fmt.Errorf("inode %d: short extref item", ino)
				}
				r.parent, hdr = ne.Uint64(b[0:]), 18
			default:
				return nil
			}
			l := int(ne.Uint16(b[hdr-2:]))
			if len(b) < hdr+l {
				return fmt.Errorf("inode %d: truncated ref item", ino)
			}
			r.name = string(b[hdr : hdr+l])
			refs = append(refs, r)
			b = b[hdr+l:]
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("paths of inode %d: %w", ino, err)
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("paths of inode %d: %w", ino, unix.ENOENT)
	}
	var out []string
	for _, r := range refs {
		pp, ok := dirs[r.parent]
		if !ok {
			ps, err := refPaths(fd, r.parent, dirs, depth+1)
			if err != nil {
				return nil, err
			}
			if len(ps) != 1 {
				return nil, fmt.Errorf("directory inode %d has %d names", r.parent, len(ps))
			}
			pp = ps[0]
			dirs[r.parent] = pp
		}
		if pp == "" {
			out = append(out, r.name)
		} else {
			out = append(out, pp+"/"+r.name)
		}
	}
	return out, nil
}
