package mounts

import (
	"encoding/binary"
	"strings"
	"testing"
)

// statmountAnswer encodes an answer as the kernel lays it out.
func statmountAnswer(mask uint64, flags uint32, fsType, point, opts string) []byte {
	le := binary.NativeEndian
	strs := fsType + "\x00" + point + "\x00" + opts + "\x00"
	buf := make([]byte, statmountSize+len(strs))
	le.PutUint32(buf[0:], uint32(len(buf)))
	le.PutUint64(buf[8:], mask)
	le.PutUint32(buf[32:], flags)
	le.PutUint32(buf[36:], 0)
	le.PutUint32(buf[108:], uint32(len(fsType)+1))
	le.PutUint32(buf[4:], uint32(len(fsType)+len(point)+2))
	copy(buf[statmountSize:], strs)
	return buf
}

func TestParseStatmount(t *testing.T) {
	const all = statmountSBBasic | statmountMntPoint | statmountFSType | statmountMntOpts
	m, err := parseStatmount(statmountAnswer(all, sbRdonly|sbLazytime, "overlay", "/r", "lowerdir+=/,index=on"), all)
	if err != nil || m.FSType != "overlay" || m.Point != "/r" || m.VFSOptions != "ro,lazytime,lowerdir+=/,index=on" {
		t.Fatalf("parsed %+v, %v", m, err)
	}
	if _, err := parseStatmount(statmountAnswer(all&^statmountMntOpts, 0, "overlay", "/r", ""), all); err != ErrNoStatmount {
		t.Fatalf("an answer without mount options: %v, want ErrNoStatmount", err)
	}
}

// FuzzParseStatmount: any answer parses or fails, never reads past it,
// and what it tells comes from inside it.
func FuzzParseStatmount(f *testing.F) {
	const all = statmountSBBasic | statmountMntPoint | statmountFSType | statmountMntOpts
	f.Add(statmountAnswer(all, 0, "overlay", "/sandboxes/a/root", "lowerdir+=/,upperdir=/upper"))
	f.Add(statmountAnswer(all, 1, "", "", ""))
	f.Add(make([]byte, statmountSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseStatmount(b, all)
		if err != nil {
			return
		}
		for _, s := range []string{m.Point, m.FSType} {
			if strings.Contains(s, "\x00") || !strings.Contains(string(b), s) {
				t.Fatalf("told %q, not a string of the answer", s)
			}
		}
	})
}
