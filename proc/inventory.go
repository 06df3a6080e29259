package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/proto"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc/criu"
)

// Inventory is what a restore receipt compares of a container's processes:
// every process (the keeper included, since it is in every image) by its
// pid inside the container and its command name, and the TCP sockets
// listening in the container's network namespace. An image's inventory is
// read from CRIU's own files (ImageInventory), a running container's from
// /proc (Runtime.Inventory), so neither side is turnsnap's record of the
// other.
type Inventory struct {
	Procs []InventoryProc `json:"procs"` // sorted by PID
	// Listening are "tcp:PORT" and "tcp6:PORT", sorted, each once.
	Listening []string `json:"listening"`
}

// InventoryProc is one process of an Inventory.
type InventoryProc struct {
	PID int `json:"pid"` // inside the container's pid namespace
	// PPID is the parent's pid inside the container (0: outside it).
	PPID int    `json:"ppid"`
	Comm string `json:"comm"` // the kernel's command name (at most 15 bytes)
	// Cmdline is the running process's arguments; an image's inventory
	// leaves it empty (CRIU keeps it only in the process's memory pages).
	Cmdline []string `json:"cmdline,omitempty"`
}

// TCP states and address families as CRIU and /proc/net/tcp write them.
const (
	tcpListen = 10
	afInet    = 2
	afInet6   = 10
)

// ImageInventory reads the processes and listening TCP sockets of the
// image in imageDir from CRIU's pstree.img, core-PID.img and files.img.
func ImageInventory(imageDir string) (Inventory, error) {
	var inv Inventory
	var pids, ppids []int
	err := criu.ReadImage(filepath.Join(imageDir, "pstree.img"), func() proto.Message { return &pstree.PstreeEntry{} },
		func(m proto.Message) {
			e := m.(*pstree.PstreeEntry)
			pids, ppids = append(pids, int(e.GetPid())), append(ppids, int(e.GetPpid()))
		})
	if err != nil {
		return inv, fmt.Errorf("image %s: process tree: %w", imageDir, err)
	}
	for i, pid := range pids {
		var comm string
		err := criu.ReadImage(filepath.Join(imageDir, fmt.Sprintf("core-%d.img", pid)), func() proto.Message { return &criucore.CoreEntry{} },
			func(m proto.Message) { comm = m.(*criucore.CoreEntry).GetTc().GetComm() })
		if err != nil {
			return inv, fmt.Errorf("image %s: process %d: %w", imageDir, pid, err)
		}
		inv.Procs = append(inv.Procs, InventoryProc{PID: pid, PPID: ppids[i], Comm: comm})
	}
	err = criu.ReadImage(filepath.Join(imageDir, "files.img"), func() proto.Message { return &fdinfo.FileEntry{} },
		func(m proto.Message) {
			sk := m.(*fdinfo.FileEntry).GetIsk()
			if sk == nil || sk.GetState() != tcpListen {
				return
			}
			switch sk.GetFamily() {
			case afInet:
				inv.Listening = append(inv.Listening, fmt.Sprintf("tcp:%d", sk.GetSrcPort()))
			case afInet6:
				inv.Listening = append(inv.Listening, fmt.Sprintf("tcp6:%d", sk.GetSrcPort()))
			}
		})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return inv, fmt.Errorf("image %s: files: %w", imageDir, err)
	}
	inv.sort()
	return inv, nil
}

// Inventory reads the processes alive in container id now and the TCP
// sockets listening in its network namespace. It spawns nothing.
func (r *Runtime) Inventory(ctx context.Context, id string) (Inventory, error) {
	var inv Inventory
	if err := checkID(id); err != nil {
		return inv, err
	}
	ci, err := r.info(id)
	if err != nil {
		return inv, err
	}
	if !ci.alive() {
		return inv, fmt.Errorf("container %s: not running: %w", id, errdefs.ErrPrecondition)
	}
	pids, err := ci.pids()
	if err != nil {
		return inv, err
	}
	byHost := map[int]int{} // host pid -> pid in the container
	var ppidHost []int
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return inv, err
		}
		p, st, err := readProcess(pid)
		if err != nil {
			continue // exited between the cgroup read and now: not alive
		}
		byHost[pid] = p.PID
		ppidHost = append(ppidHost, st.ppid)
		inv.Procs = append(inv.Procs, InventoryProc{PID: p.PID, Comm: p.Comm, Cmdline: p.Cmdline})
	}
	for i := range inv.Procs {
		inv.Procs[i].PPID = byHost[ppidHost[i]] // 0: a parent outside
	}
	// The init shares the container's network namespace with every
	// process in it: its view of /proc/net is the container's.
	for _, f := range []struct{ file, prefix string }{{"tcp", "tcp"}, {"tcp6", "tcp6"}} {
		ports, err := listeningPorts(fmt.Sprintf("/proc/%d/net/%s", ci.InitPID, f.file))
		if err != nil {
			return inv, fmt.Errorf("container %s: %w", id, err)
		}
		for _, p := range ports {
			inv.Listening = append(inv.Listening, fmt.Sprintf("%s:%d", f.prefix, p))
		}
	}
	inv.sort()
	return inv, nil
}

// listeningPorts reads the local ports of the listening sockets of one
// /proc/net/tcp{,6} file ("sl local_address rem_address st ...", the
// address "HEXADDR:HEXPORT", state 0A listening). A missing file (no IPv6)
// lists none.
func listeningPorts(path string) ([]int, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 4 || fl[3] != "0A" {
			continue
		}
		_, port, ok := strings.Cut(fl[1], ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(port, 16, 16); err == nil {
			out = append(out, int(n))
		}
	}
	return out, sc.Err()
}

func (inv *Inventory) sort() {
	slices.SortFunc(inv.Procs, func(a, b InventoryProc) int { return a.PID - b.PID })
	slices.Sort(inv.Listening)
	inv.Listening = slices.Compact(inv.Listening)
	if inv.Listening == nil {
		inv.Listening = []string{}
	}
	if inv.Procs == nil {
		inv.Procs = []InventoryProc{}
	}
}

// Compare lists how got (a restored container) differs from want (its
// image): missing, what the restore failed to bring back; and churn, what
// the restored processes did themselves since, which is no failure.
//
// A process of the image must run with its command, and no process may
// run that the image lacks, with one allowance, for the time between the
// restore and the look: a process whose parent is a process of the image
// other than the container's init (a shell loop's short-lived child) may
// have exited or exec'd another command (forked before the cut), and one
// whose parent is such a process may have started.
// The processes the init parents (what was started in the sandbox and
// meant to live on) are never allowed to be gone. Every listening socket
// of the image must listen, and no other.
func (want Inventory) Compare(got Inventory) (missing, churn []string) {
	running := make(map[int]InventoryProc, len(got.Procs))
	for _, p := range got.Procs {
		running[p.PID] = p
	}
	inImage := make(map[int]InventoryProc, len(want.Procs))
	for _, p := range want.Procs {
		inImage[p.PID] = p
	}
	// A parent other than the init that is running: its children come and go.
	transient := func(ppid int) bool {
		_, ok := running[ppid]
		return ppid > 1 && ok
	}
	for _, w := range want.Procs {
		g, ok := running[w.PID]
		switch {
		case ok && g.Comm != w.Comm && transient(w.PPID):
			// Forked before the cut, it went on to exec after the restore.
			churn = append(churn, fmt.Sprintf("process %d, a child of %d, went from %q to %q", w.PID, w.PPID, w.Comm, g.Comm))
		case ok && g.Comm != w.Comm:
			missing = append(missing, fmt.Sprintf("process %d is %q, the image's is %q", w.PID, g.Comm, w.Comm))
		case !ok && transient(w.PPID):
			churn = append(churn, fmt.Sprintf("process %d (%s), a child of %d, exited", w.PID, w.Comm, w.PPID))
		case !ok:
			missing = append(missing, fmt.Sprintf("process %d (%s) not running", w.PID, w.Comm))
		}
	}
	for _, g := range got.Procs {
		if _, ok := inImage[g.PID]; ok {
			continue
		}
		if _, parentInImage := inImage[g.PPID]; parentInImage && transient(g.PPID) {
			churn = append(churn, fmt.Sprintf("process %d (%s), a child of %d, started", g.PID, g.Comm, g.PPID))
			continue
		}
		missing = append(missing, fmt.Sprintf("process %d (%s) is not in the image", g.PID, g.Comm))
	}
	for _, l := range want.Listening {
		if !slices.Contains(got.Listening, l) {
			missing = append(missing, "socket "+l+" not listening")
		}
	}
	for _, l := range got.Listening {
		// The restored processes run on from the cut: one dumped while it
		// started may bind its port after the restore. That adds to the
		// image; it does not lose anything of it (a process not in the
		// image is caught above).
		if !slices.Contains(want.Listening, l) {
			churn = append(churn, "socket "+l+" listening since the restore, not in the image")
		}
	}
	return missing, churn
}
