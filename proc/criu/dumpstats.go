package criu

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"time"

	stats "github.com/checkpoint-restore/go-criu/v7/crit/images/stats"
	"google.golang.org/protobuf/proto"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// DumpStats are CRIU's own figures for one dump, from the stats-dump file
// it writes into its work directory: how long it kept the tasks frozen and
// where that time went, and how many pages it scanned and wrote. The pause
// turnsnap measures (freeze to thaw) holds all of FrozenTime plus what
// runc, CRIU's start and the filesystem scan add around it.
type DumpStats struct {
	// FreezingTime is how long CRIU took to freeze the tasks: about zero
	// when the cut had frozen them already.
	FreezingTime time.Duration `json:"freezing_time"`
	// FrozenTime is CRIU's frozen_time: from the tasks being frozen to
	// CRIU letting them go.
	FrozenTime time.Duration `json:"frozen_time"`
	// MemdumpTime is the time spent draining the tasks' memory through the
	// parasite, MemwriteTime the time spent writing it into the image.
	MemdumpTime  time.Duration `json:"memdump_time"`
	MemwriteTime time.Duration `json:"memwrite_time"`
	// PagesScanned are the pages CRIU looked at, PagesWritten the ones it
	// wrote, PagesSkippedParent the ones a parent image held.
	PagesScanned       uint64 `json:"pages_scanned"`
	PagesWritten       uint64 `json:"pages_written"`
	PagesSkippedParent uint64 `json:"pages_skipped_parent,omitempty"`
}

// StatsDumpFile is the name of CRIU's dump statistics file in the work
// directory of a dump.
const StatsDumpFile = "stats-dump"

// The header of a CRIU statistics image (go-criu's stats/types.go, whose
// package cannot be linked beside crit's copy of the same proto): the
// service-image magic, the stats magic, the payload's size.
const (
	imgServiceMagic = 0x55105940
	statsMagic      = 0x57093306
	statsPayloadAt  = 12
)

// maxStatsFile bounds what ReadDumpStats reads: the file is a 12-byte
// header and a protobuf message of a few dozen bytes.
const maxStatsFile = 64 << 10

// ReadDumpStats parses a CRIU stats-dump file: the image magic, CRIU's
// stats magic, a payload size, and a StatsEntry message (go-criu's stats
// proto, as crit carries it). go-criu's own reader trusts the sizes in the file; this one
// checks them, so a damaged file is an error (ErrCorrupt), never a panic.
func ReadDumpStats(path string) (DumpStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return DumpStats{}, err
	}
	defer f.Close()
	buf, err := io.ReadAll(io.LimitReader(f, maxStatsFile+1))
	if err != nil {
		return DumpStats{}, err
	}
	d, err := parseDumpStats(buf)
	if err != nil {
		return DumpStats{}, fmt.Errorf("CRIU statistics %s: %w", path, err)
	}
	return d, nil
}

func parseDumpStats(buf []byte) (DumpStats, error) {
	if len(buf) > maxStatsFile {
		return DumpStats{}, fmt.Errorf("more than %d bytes: %w", maxStatsFile, errdefs.ErrCorrupt)
	}
	if len(buf) < statsPayloadAt {
		return DumpStats{}, fmt.Errorf("%d bytes, shorter than its header: %w", len(buf), errdefs.ErrCorrupt)
	}
	if binary.LittleEndian.Uint32(buf[0:]) != imgServiceMagic || binary.LittleEndian.Uint32(buf[4:]) != statsMagic {
		return DumpStats{}, fmt.Errorf("not a CRIU statistics image (bad magic): %w", errdefs.ErrCorrupt)
	}
	size := binary.LittleEndian.Uint32(buf[8:])
	if uint64(size) > uint64(len(buf)-statsPayloadAt) {
		return DumpStats{}, fmt.Errorf("payload of %d bytes in a file of %d: %w", size, len(buf), errdefs.ErrCorrupt)
	}
	var st stats.StatsEntry
	if err := proto.Unmarshal(buf[statsPayloadAt:statsPayloadAt+int(size)], &st); err != nil {
		return DumpStats{}, fmt.Errorf("%v: %w", err, errdefs.ErrCorrupt)
	}
	dump := st.GetDump()
	if dump == nil {
		return DumpStats{}, fmt.Errorf("no dump statistics in it: %w", errdefs.ErrCorrupt)
	}
	us := func(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
	return DumpStats{
		FreezingTime: us(dump.GetFreezingTime()), FrozenTime: us(dump.GetFrozenTime()),
		MemdumpTime: us(dump.GetMemdumpTime()), MemwriteTime: us(dump.GetMemwriteTime()),
		PagesScanned: dump.GetPagesScanned(), PagesWritten: dump.GetPagesWritten(),
		PagesSkippedParent: dump.GetPagesSkippedParent(),
	}, nil
}
