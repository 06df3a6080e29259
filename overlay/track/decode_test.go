package track

import (
	"encoding/binary"
	"errors"
	"testing"
)

// encodeEvent builds one event as the kernel lays it out.
func encodeEvent(mask uint64, recs ...fidRecord) []byte {
	var info []byte
	for _, r := range recs {
		body := make([]byte, fanFsidLen+fanHandleHdrLen, fanFsidLen+fanHandleHdrLen+len(r.Handle)+len(r.Name)+1)
		binary.NativeEndian.PutUint32(body[fanFsidLen:], uint32(len(r.Handle)))
		binary.NativeEndian.PutUint32(body[fanFsidLen+4:], uint32(r.HandleType))
		body = append(body, r.Handle...)
		if r.Name != "" {
			body = append(body, r.Name...)
			body = append(body, 0)
		}
		for len(body)%4 != 0 { // the kernel pads records to 4 bytes
			body = append(body, 0)
		}
		h := make([]byte, fanInfoHeaderLen)
		h[0] = r.Kind
		binary.NativeEndian.PutUint16(h[2:], uint16(fanInfoHeaderLen+len(body)))
		info = append(append(info, h...), body...)
	}
	m := make([]byte, fanMetadataLen)
	binary.NativeEndian.PutUint32(m[0:], uint32(fanMetadataLen+len(info)))
	m[4] = fanMetadataVers
	binary.NativeEndian.PutUint16(m[6:], fanMetadataLen)
	binary.NativeEndian.PutUint64(m[8:], mask)
	binary.NativeEndian.PutUint32(m[16:], ^uint32(0)) // FAN_NOFD
	return append(m, info...)
}

func TestDecodeEvents(t *testing.T) {
	buf := append(encodeEvent(0x100, fidRecord{Kind: infoDFIDName, HandleType: 0xfb, Handle: []byte{1, 2, 3, 4, 5}, Name: "file.txt"},
		fidRecord{Kind: infoFID, HandleType: 0xfb, Handle: []byte{9, 9}}),
		encodeEvent(0x4000)...)
	var got []rawEvent
	if err := decodeEvents(buf, func(ev rawEvent) error { got = append(got, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Mask != 0x100 || len(got[0].Records) != 2 || got[0].Records[0].Name != "file.txt" ||
		string(got[0].Records[0].Handle) != "\x01\x02\x03\x04\x05" || got[0].Records[1].Kind != infoFID || got[1].Mask != 0x4000 {
		t.Fatalf("decoded %+v", got)
	}
	good := encodeEvent(0x100, fidRecord{Kind: infoDFIDName, Handle: []byte{1}, Name: "x"})
	for name, bad := range map[string][]byte{
		"short":         good[:10],
		"cut record":    good[:len(good)-2],
		"slash in name": encodeEvent(0x100, fidRecord{Kind: infoDFIDName, Handle: []byte{1}, Name: "a/b"}),
		"dotdot":        encodeEvent(0x100, fidRecord{Kind: infoDFIDName, Handle: []byte{1}, Name: ".."}),
		"huge handle":   encodeEvent(0x100, fidRecord{Kind: infoFID, Handle: make([]byte, maxHandleBytes+1)}),
		"no terminator": func() []byte {
			b := append([]byte(nil), good...)
			b[len(b)-1], b[len(b)-2], b[len(b)-3] = 'a', 'a', 'a'
			return b
		}(),
		"event too long": func() []byte { b := append([]byte(nil), good...); binary.NativeEndian.PutUint32(b, 1<<20); return b }(),
		"bad version":    func() []byte { b := append([]byte(nil), good...); b[4] = 2; return b }(),
	} {
		if err := decodeEvents(bad, func(rawEvent) error { return nil }); !errors.Is(err, errBadEvent) {
			t.Errorf("%s: accepted (%v)", name, err)
		}
	}
}

// FuzzDecodeEvents feeds the fanotify decoder arbitrary buffers: it may
// only fail with errBadEvent, never panic, and every record it returns
// lies within the buffer and within the kernel's limits.
func FuzzDecodeEvents(f *testing.F) {
	f.Add(encodeEvent(0x100, fidRecord{Kind: infoDFIDName, HandleType: 0xfb, Handle: []byte{1, 2, 3}, Name: "f"},
		fidRecord{Kind: infoFID, HandleType: 0xfb, Handle: []byte{4}}))
	f.Add(encodeEvent(0x4000))
	f.Add(append(encodeEvent(0x40, fidRecord{Kind: infoOldDFIDName, Handle: []byte{1}, Name: "a"}),
		encodeEvent(0x80, fidRecord{Kind: infoNewDFIDName, Handle: []byte{1}, Name: "b"})...))
	f.Fuzz(func(t *testing.T, buf []byte) {
		err := decodeEvents(buf, func(ev rawEvent) error {
			for _, r := range ev.Records {
				if len(r.Handle) > maxHandleBytes || len(r.Name) > maxEventLen {
					t.Fatalf("record beyond limits: %d-byte handle, %d-byte name", len(r.Handle), len(r.Name))
				}
			}
			return nil
		})
		if err != nil && !errors.Is(err, errBadEvent) {
			t.Fatalf("error %v is not errBadEvent", err)
		}
	})
}
