package proc

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/turnsnap/turnsnap/internal/benchenv"
	"golang.org/x/sys/unix"
)

// What a pause proportional to dirtied memory could use on this kernel
// (docs/PROCESSES.md, "Dirty memory without soft-dirty"): userfaultfd
// write-protection in asynchronous mode, read back with PAGEMAP_SCAN. The
// constants and structures are the kernel's (linux/userfaultfd.h,
// linux/fs.h); golang.org/x/sys does not carry them yet.
const (
	uffdAPI                  = 0xAA
	uffdFeatureWPUnpopulated = 1 << 13
	uffdFeatureWPAsync       = 1 << 15
	uffdRegisterModeWP       = 1 << 1
	uffdWriteprotectModeWP   = 1 << 0

	pmScanWPMatching   = 1 << 0 // write-protect the pages it reports, atomically
	pmScanCheckWPAsync = 1 << 1 // refuse a range not registered in async mode
	pageIsWritten      = 1 << 1
)

type uffdioAPI struct{ API, Features, Ioctls uint64 }
type uffdioRange struct{ Start, Len uint64 }
type uffdioRegister struct {
	Range        uffdioRange
	Mode, Ioctls uint64
}
type uffdioWriteprotect struct {
	Range uffdioRange
	Mode  uint64
}
type pageRegion struct{ Start, End, Categories uint64 }
type pmScanArg struct {
	Size, Flags, Start, End, WalkEnd, Vec, VecLen, MaxPages       uint64
	CategoryInverted, CategoryMask, CategoryAnyofMask, ReturnMask uint64
}

// iowr is the kernel's _IOWR(type, nr, size).
func iowr(typ, nr, size uintptr) uintptr { return 3<<30 | size<<16 | typ<<8 | nr }

var (
	uffdioAPIReq          = iowr(0xAA, 0x3F, unsafe.Sizeof(uffdioAPI{}))
	uffdioRegisterReq     = iowr(0xAA, 0x00, unsafe.Sizeof(uffdioRegister{}))
	uffdioWriteprotectReq = iowr(0xAA, 0x06, unsafe.Sizeof(uffdioWriteprotect{}))
	pagemapScanReq        = iowr('f', 16, unsafe.Sizeof(pmScanArg{}))
)

func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// wpTracker tracks writes to one anonymous mapping of this process with
// async uffd-wp: a write to a protected page is resolved by the kernel
// without a fault handler, and only clears the page's protection, which
// PAGEMAP_SCAN then reports as PAGE_IS_WRITTEN.
type wpTracker struct {
	uffd, pagemap int
	mem           []byte
	vec           []pageRegion
}

func newWPTracker(b *testing.B, mem []byte) *wpTracker {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		b.Fatalf("userfaultfd: %v", e)
	}
	t := &wpTracker{uffd: int(fd), mem: mem, vec: make([]pageRegion, 4096)}
	b.Cleanup(func() { unix.Close(t.uffd) })
	api := uffdioAPI{API: uffdAPI, Features: uffdFeatureWPAsync | uffdFeatureWPUnpopulated}
	if err := ioctlPtr(t.uffd, uffdioAPIReq, unsafe.Pointer(&api)); err != nil {
		b.Fatalf("UFFDIO_API with WP_ASYNC: %v", err)
	}
	rng := uffdioRange{Start: uint64(uintptr(unsafe.Pointer(&mem[0]))), Len: uint64(len(mem))}
	reg := uffdioRegister{Range: rng, Mode: uffdRegisterModeWP}
	if err := ioctlPtr(t.uffd, uffdioRegisterReq, unsafe.Pointer(&reg)); err != nil {
		b.Fatalf("UFFDIO_REGISTER (WP): %v", err)
	}
	pm, err := unix.Open("/proc/self/pagemap", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	t.pagemap = pm
	b.Cleanup(func() { unix.Close(t.pagemap) })
	return t
}

// protect write-protects the whole mapping: the start of a turn.
func (t *wpTracker) protect(b *testing.B) {
	wp := uffdioWriteprotect{Range: uffdioRange{Start: uint64(uintptr(unsafe.Pointer(&t.mem[0]))), Len: uint64(len(t.mem))},
		Mode: uffdWriteprotectModeWP}
	if err := ioctlPtr(t.uffd, uffdioWriteprotectReq, unsafe.Pointer(&wp)); err != nil {
		b.Fatalf("UFFDIO_WRITEPROTECT: %v", err)
	}
}

// written returns the pages written since the last protect or scan, and
// write-protects them again in the same call (the next turn's start).
func (t *wpTracker) written(b *testing.B) int {
	start := uint64(uintptr(unsafe.Pointer(&t.mem[0])))
	end := start + uint64(len(t.mem))
	pages := 0
	for start < end {
		arg := pmScanArg{Size: uint64(unsafe.Sizeof(pmScanArg{})), Flags: pmScanWPMatching | pmScanCheckWPAsync,
			Start: start, End: end, Vec: uint64(uintptr(unsafe.Pointer(&t.vec[0]))), VecLen: uint64(len(t.vec)),
			CategoryMask: pageIsWritten, ReturnMask: pageIsWritten}
		r1, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(t.pagemap), pagemapScanReq, uintptr(unsafe.Pointer(&arg)))
		if e != 0 {
			b.Fatalf("PAGEMAP_SCAN: %v", e)
		}
		for _, r := range t.vec[:r1] {
			pages += int((r.End - r.Start) / uint64(os.Getpagesize()))
		}
		start = arg.WalkEnd
	}
	return pages
}

// BenchmarkScaleDirtyTracking measures, in this process, what dirty-page
// tracking costs and saves on this kernel (no soft-dirty): a 1 GiB
// anonymous mapping (64 MiB under TURNSNAP_BENCH_SMALL), every page
// touched, registered for async uffd-wp and protected; then half of its
// pages are written (one word each) and PAGEMAP_SCAN lists the written
// ones and protects them again.
//
//   - scan-ms: PAGEMAP_SCAN of the whole mapping (finds exactly the
//     written pages, or the benchmark fails), re-protection included;
//   - read-all-ms: the baseline, reading every byte of the mapping (what
//     a dump without tracking must at least do), and x-read-all, the ratio;
//   - copy-written-ms: copying only the written pages out (the memory an
//     incremental dump would write);
//   - dirty-wp-ms and dirty-plain-ms: the writes themselves with the
//     tracking armed and on a plain mapping (the cost to the sandbox's
//     process: one minor fault per first write to a page), x-dirty-wp;
//   - rescan-pages: a second scan with no writes between must find 0.
func BenchmarkScaleDirtyTracking(b *testing.B) {
	loadStart := benchenv.Load1(b) // reported at the end: ResetTimer drops earlier metrics
	size := benchenv.Size(1024, 64) << 20
	page := os.Getpagesize()
	mapAnon := func() []byte {
		m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Munmap(m) })
		for i := 0; i < len(m); i += page {
			m[i] = 1
		}
		return m
	}
	mem, plain := mapAnon(), mapAnon()
	t := newWPTracker(b, mem)
	dirtyHalf := func(m []byte, round byte) time.Duration {
		start := time.Now()
		for i := 0; i < len(m)/2; i += page {
			m[i+8] = round
		}
		return time.Since(start)
	}
	out := make([]byte, size/2)
	var scan, readAll, copyWritten, dirtyWP, dirtyPlain time.Duration
	b.ResetTimer()
	for i := range b.N {
		t.protect(b)
		dirtyWP += dirtyHalf(mem, byte(i))
		dirtyPlain += dirtyHalf(plain, byte(i))
		start := time.Now()
		n := t.written(b)
		scan += time.Since(start)
		if n != size/2/page {
			b.Fatalf("PAGEMAP_SCAN found %d written pages, want %d", n, size/2/page)
		}
		start = time.Now()
		copy(out, mem[:size/2])
		copyWritten += time.Since(start)
		start = time.Now()
		var sum uint64
		for j := 0; j+8 <= len(mem); j += 8 {
			sum += *(*uint64)(unsafe.Pointer(&mem[j]))
		}
		readAll += time.Since(start)
		if sum == 0 {
			b.Fatal("read nothing")
		}
		if again := t.written(b); again != 0 {
			b.Fatalf("a second scan with no writes found %d pages", again)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(size>>20), "mapping-MiB")
	b.ReportMetric(msOf(scan)/n, "scan-ms")
	b.ReportMetric(msOf(readAll)/n, "read-all-ms")
	b.ReportMetric(float64(scan)/float64(readAll), "x-read-all")
	b.ReportMetric(msOf(copyWritten)/n, "copy-written-ms")
	b.ReportMetric(msOf(dirtyWP)/n, "dirty-wp-ms")
	b.ReportMetric(msOf(dirtyPlain)/n, "dirty-plain-ms")
	b.ReportMetric(float64(dirtyWP)/float64(dirtyPlain), "x-dirty-wp")
	b.ReportMetric(0, "rescan-pages")
	b.ReportMetric(loadStart, "load-start")
	b.ReportMetric(benchenv.Load1(b), "load-end")
}
