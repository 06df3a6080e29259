package criu

import (
	"errors"
	"os"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// testdata/stats-dump is the file CRIU 4.2.1 wrote for a dump of a busybox
// container (its keeper, httpd and a shell) on this project's machines. It
// parses to plausible figures, and every truncation or corruption of it is
// ErrCorrupt, never a panic or a silent zero.
func TestReadDumpStats(t *testing.T) {
	d, err := ReadDumpStats("testdata/stats-dump")
	if err != nil {
		t.Fatal(err)
	}
	if d.FrozenTime <= 0 || d.PagesScanned == 0 || d.PagesWritten == 0 || d.PagesWritten > d.PagesScanned ||
		d.MemdumpTime > d.FrozenTime {
		t.Fatalf("implausible statistics: %+v", d)
	}
	raw, err := os.ReadFile("testdata/stats-dump")
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][]byte{"empty": nil, "header only": raw[:12], "truncated": raw[:len(raw)-3],
		"big": make([]byte, maxStatsFile+1)}
	for _, i := range []int{0, 4, 8} { // each magic, and the size
		b := append([]byte(nil), raw...)
		b[i] ^= 0xff
		bad["flipped byte "+string(rune('0'+i))] = b
	}
	for name, b := range bad {
		if _, err := parseDumpStats(b); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzParseDumpStats: any bytes parse or are ErrCorrupt.
func FuzzParseDumpStats(f *testing.F) {
	raw, err := os.ReadFile("testdata/stats-dump")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := parseDumpStats(b); err != nil && !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
	})
}
