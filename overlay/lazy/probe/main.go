// Command probe measures what fanotify pre-content events do on this
// kernel (docs/STORAGE.md, "Lazy restore", records its answers):
//
//	probe inode|fs|mount MARKPATH FILL CMD...
//
// makes a FAN_CLASS_PRE_CONTENT group, marks MARKPATH (an inode, its
// filesystem or its mount) for FAN_PRE_ACCESS, runs each CMD with sh -c in
// another process, and prints every event (mask, pid, path, range record).
// Each event's file is filled with FILL repeated to its size (@FILE: that
// file's bytes; "-": nothing) through the event's descriptor, then allowed.
// MASK=open marks FAN_OPEN_PERM instead, MASK=both both, MASK=dir adds
// FAN_ONDIR; HANG=1 never answers (to see what an access gets when the
// listener dies). Run it as root on throwaway mounts: a filesystem mark on
// the host's root would hold every read of every process on it.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Println("usage: probe inode|fs|mount MARKPATH FILL CMD...")
		os.Exit(2)
	}
	kind, mark, fill := os.Args[1], os.Args[2], os.Args[3]
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_PRE_CONTENT|unix.FAN_CLOEXEC, unix.O_RDWR|unix.O_LARGEFILE)
	if err != nil {
		fmt.Println("init:", err)
		os.Exit(1)
	}
	flags := uint(unix.FAN_MARK_ADD)
	switch kind {
	case "fs":
		flags |= unix.FAN_MARK_FILESYSTEM
	case "mount":
		flags |= unix.FAN_MARK_MOUNT
	}
	mask := uint64(unix.FAN_PRE_ACCESS)
	switch os.Getenv("MASK") {
	case "open":
		mask = unix.FAN_OPEN_PERM
	case "both":
		mask |= unix.FAN_OPEN_PERM
	case "dir":
		mask |= unix.FAN_ONDIR
	case "dirsub":
		mask |= unix.FAN_ONDIR | unix.FAN_EVENT_ON_CHILD
	}
	if err := unix.FanotifyMark(fd, flags, mask, unix.AT_FDCWD, mark); err != nil {
		fmt.Println("mark PRE_ACCESS:", kind, mark, err)
		os.Exit(1)
	}
	fmt.Println("mark ok:", kind, mark)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil {
				fmt.Println("read:", err)
				return
			}
			for off := 0; off < n; {
				md := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
				p, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", md.Fd))
				info := ""
				for io := off + int(md.Metadata_len); io < off+int(md.Event_len); {
					typ, l := buf[io], binary.LittleEndian.Uint16(buf[io+2:])
					if typ == 6 {
						info += fmt.Sprintf(" range off=%d count=%d", binary.LittleEndian.Uint64(buf[io+8:]), binary.LittleEndian.Uint64(buf[io+16:]))
					} else {
						info += fmt.Sprintf(" info type=%d", typ)
					}
					io += int(l)
				}
				fmt.Printf("event mask=%#x pid=%d path=%s%s\n", md.Mask, md.Pid, p, info)
				if fill != "-" && md.Fd >= 0 && os.Getenv("MASK") != "dir" {
					var st unix.Stat_t
					unix.Fstat(int(md.Fd), &st)
					data := []byte(strings.Repeat(fill, int(st.Size)/len(fill)+1))[:st.Size]
					if strings.HasPrefix(fill, "@") {
						data, _ = os.ReadFile(fill[1:])
					}
					if _, err := unix.Pwrite(int(md.Fd), data, 0); err != nil {
						fmt.Println("fill write:", err)
					}
				}
				if os.Getenv("HANG") != "" {
					continue // never answer: what does the accessor get when this process dies?
				}
				resp := unix.FanotifyResponse{Fd: md.Fd, Response: unix.FAN_ALLOW}
				unix.Write(fd, (*[8]byte)(unsafe.Pointer(&resp))[:])
				unix.Close(int(md.Fd))
				off += int(md.Event_len)
			}
		}
	}()
	for _, c := range os.Args[4:] {
		t := time.Now()
		out, err := exec.Command("sh", "-c", c).CombinedOutput()
		fmt.Printf("cmd %q -> %q err=%v (%v)\n", c, strings.TrimSpace(string(out)), err, time.Since(t))
	}
	time.Sleep(100 * time.Millisecond)
}
