// Command memhog is the benchmark's large process: it fills MiB mebibytes
// with pseudo-random bytes (non-zero, non-uniform, so neither CRIU nor the
// content store gets them for free), touches every page, writes READY, and
// then only sleeps. Built statically at benchmark time (CGO_ENABLED=0) and
// copied into the container's rootfs.
//
// On SIGUSR1 it rewrites the first half of its memory with other
// pseudo-random bytes (half of it dirtied, as between two turns) and then
// writes the count of such rounds to READY.dirtied.
//
//	memhog MiB READY
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
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
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	buf := make([]byte, mib<<20)
	fill(buf, 0x9E3779B97F4A7C15)
	if err := os.WriteFile(os.Args[2], []byte("ready\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "memhog:", err)
		os.Exit(1)
	}
	for round := 1; ; round++ {
		<-usr1
		fill(buf[:len(buf)/2], 0x9E3779B97F4A7C15^uint64(round))
		if err := os.WriteFile(os.Args[2]+".dirtied", []byte(strconv.Itoa(round)+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "memhog:", err)
			os.Exit(1)
		}
		runtime.KeepAlive(buf)
	}
}

// fill writes xorshift64 values (fast, never zero) from seed over b.
func fill(b []byte, x uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}
