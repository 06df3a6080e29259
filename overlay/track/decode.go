package track

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The fanotify wire format (linux/fanotify.h), as a group made with
// FAN_REPORT_DFID_NAME|FAN_REPORT_FID reads it: each event is a
// fanotify_event_metadata followed by info records, each a
// fanotify_event_info_header {type u8, pad u8, len u16} and for the fid
// kinds the fsid (8 bytes), a struct file_handle {handle_bytes u32,
// handle_type s32, f_handle[handle_bytes]} and, for the DFID_NAME kinds, a
// NUL-terminated name.
const (
	fanMetadataLen   = 24
	fanMetadataVers  = 3 // FANOTIFY_METADATA_VERSION
	fanInfoHeaderLen = 4
	fanFsidLen       = 8
	fanHandleHdrLen  = 8
	// maxHandleBytes is MAX_HANDLE_SZ: no file handle the kernel makes is
	// longer, so a longer one is a broken record.
	maxHandleBytes = 128
	// maxEventLen bounds one event: the metadata, a FID record and a
	// DFID_NAME record with a NAME_MAX name, with room to spare.
	maxEventLen = 4096
)

// Info record types (FAN_EVENT_INFO_TYPE_*).
const (
	infoFID         = 1
	infoDFIDName    = 2
	infoDFID        = 3
	infoOldDFIDName = 10
	infoNewDFIDName = 12
)

// fidRecord is one fid info record of an event.
type fidRecord struct {
	Kind       uint8  // infoFID, infoDFIDName ...
	HandleType int32  // file_handle.handle_type
	Handle     []byte // file_handle.f_handle (aliases the read buffer)
	Name       string // the entry's name, for the DFID_NAME kinds ("." for the directory itself)
}

// rawEvent is one decoded event.
type rawEvent struct {
	Mask    uint64
	Pid     int32 // the writer's process (thread group) id
	Records []fidRecord
}

var errBadEvent = errors.New("malformed fanotify event")

// decodeEvents decodes a buffer filled by read(2) on a fanotify group fd.
// Every length is checked against the buffer before it is used, so a
// short or hostile buffer is an error, never a panic or an over-read; the
// caller treats any error as lost events (the next turn walks).
func decodeEvents(buf []byte, fn func(rawEvent) error) error {
	for len(buf) > 0 {
		if len(buf) < fanMetadataLen {
			return fmt.Errorf("%w: %d trailing bytes", errBadEvent, len(buf))
		}
		evLen := int(binary.NativeEndian.Uint32(buf[0:4]))
		vers := buf[4]
		metaLen := int(binary.NativeEndian.Uint16(buf[6:8]))
		if vers != fanMetadataVers {
			return fmt.Errorf("%w: metadata version %d", errBadEvent, vers)
		}
		if metaLen < fanMetadataLen || evLen < metaLen || evLen > len(buf) || evLen > maxEventLen {
			return fmt.Errorf("%w: lengths %d/%d in %d bytes", errBadEvent, metaLen, evLen, len(buf))
		}
		ev := rawEvent{Mask: binary.NativeEndian.Uint64(buf[8:16]), Pid: int32(binary.NativeEndian.Uint32(buf[20:24]))}
		info := buf[metaLen:evLen]
		for len(info) > 0 {
			rec, n, err := decodeInfo(info)
			if err != nil {
				return err
			}
			if rec != nil {
				ev.Records = append(ev.Records, *rec)
			}
			info = info[n:]
		}
		if err := fn(ev); err != nil {
			return err
		}
		buf = buf[evLen:]
	}
	return nil
}

// decodeInfo decodes the info record at the start of b and returns its
// length. Records of kinds the tracker does not use are skipped (nil).
func decodeInfo(b []byte) (*fidRecord, int, error) {
	if len(b) < fanInfoHeaderLen {
		return nil, 0, fmt.Errorf("%w: short info header", errBadEvent)
	}
	kind := b[0]
	n := int(binary.NativeEndian.Uint16(b[2:4]))
	if n < fanInfoHeaderLen || n > len(b) {
		return nil, 0, fmt.Errorf("%w: info record length %d of %d", errBadEvent, n, len(b))
	}
	switch kind {
	case infoFID, infoDFIDName, infoDFID, infoOldDFIDName, infoNewDFIDName:
	default:
		return nil, n, nil // pidfd, error, range ...: not ours
	}
	rec := b[fanInfoHeaderLen:n]
	if len(rec) < fanFsidLen+fanHandleHdrLen {
		return nil, 0, fmt.Errorf("%w: fid record of %d bytes", errBadEvent, len(rec))
	}
	rec = rec[fanFsidLen:]
	hlen := int(binary.NativeEndian.Uint32(rec[0:4]))
	htype := int32(binary.NativeEndian.Uint32(rec[4:8]))
	rec = rec[fanHandleHdrLen:]
	if hlen > maxHandleBytes || hlen > len(rec) {
		return nil, 0, fmt.Errorf("%w: file handle of %d bytes in %d", errBadEvent, hlen, len(rec))
	}
	out := &fidRecord{Kind: kind, HandleType: htype, Handle: rec[:hlen]}
	rest := rec[hlen:]
	switch kind {
	case infoDFIDName, infoOldDFIDName, infoNewDFIDName:
		end := -1
		for i, c := range rest {
			if c == 0 {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, 0, fmt.Errorf("%w: name not terminated", errBadEvent)
		}
		name := string(rest[:end])
		if name == "" || name == ".." || containsSlash(name) {
			return nil, 0, fmt.Errorf("%w: entry name %q", errBadEvent, name)
		}
		out.Name = name
	}
	return out, n, nil
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return true
		}
	}
	return false
}
