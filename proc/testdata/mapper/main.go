// Command mapper maps a file (as a program maps a shared library), writes
// a ready file, and then sleeps without waking: a long-lived process whose
// only tie to a file is a mapping. Tests build it with CGO_ENABLED=0.
//
//	mapper FILE READY
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: mapper FILE READY")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fi, err := f.Stat()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f.Close() // only the mapping holds the file now
	_ = m[0]
	if err := os.WriteFile(os.Args[2], []byte("ready\n"), 0o644); err != nil {
		os.Exit(1)
	}
	for {
		unix.Pause()
	}
}
