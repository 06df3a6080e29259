// Command memhog is the benchmark's large process: it fills MiB mebibytes
// with pseudo-random bytes (non-zero, non-uniform, so neither CRIU nor the
// content store gets them for free), touches every page, writes READY, and
// then only sleeps. Built statically at benchmark time (CGO_ENABLED=0) and
// copied into the container's rootfs.
//
//	memhog MiB READY
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: memhog MiB READY")
		os.Exit(2)
	}
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil || mib <= 0 {
		fmt.Fprintln(os.Stderr, "memhog: bad size", os.Args[1])
		os.Exit(2)
	}
	buf := make([]byte, mib<<20)
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i+8 <= len(buf); i += 8 { // xorshift64: fast, never zero
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x)
	}
	if err := os.WriteFile(os.Args[2], []byte("ready\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "memhog:", err)
		os.Exit(1)
	}
	for {
		time.Sleep(time.Hour)
		runtime.KeepAlive(buf)
	}
}
