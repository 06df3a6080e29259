package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Holder names one live process on the host: its pid and its start time
// (clock ticks after boot), so a later process that got the same pid is not
// mistaken for it. turnsnap marks what a command owns while it runs (a
// frozen container, an image work directory) with its Holder; whatever a
// dead Holder left is a leftover the next command may clean up.
type Holder struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Self is the calling process's Holder.
func Self() Holder {
	h := Holder{PID: os.Getpid()}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		if st, err := parseStat(b); err == nil {
			h.Start = st.start
		}
	}
	return h
}

// Alive reports whether the process h names still runs.
func (h Holder) Alive() bool {
	if h.PID <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.PID))
	if err != nil {
		return false
	}
	st, err := parseStat(b)
	return err == nil && st.start == h.Start && st.state != 'Z' && st.state != 'X'
}

// Gone reports whether the process h names has certainly ended: no process
// has its pid (kill(pid, 0) fails with ESRCH), or the one that has it is a
// zombie or, when h.Start is known, started at another time (a recycled
// pid). Unlike !Alive it answers false whenever it cannot tell (a /proc this
// process may not read), for callers that would do harm by taking a live
// process for dead, such as one removing the process's bucket lock.
func (h Holder) Gone() bool {
	if h.PID <= 0 {
		return false
	}
	if err := syscall.Kill(h.PID, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.PID))
	if err != nil {
		return false
	}
	st, err := parseStat(b)
	if err != nil {
		return false
	}
	return st.state == 'Z' || st.state == 'X' || h.Start != 0 && st.start != h.Start
}

// String is "PID.START", the form used in file names.
func (h Holder) String() string { return fmt.Sprintf("%d.%d", h.PID, h.Start) }

// ParseHolder parses String's form.
func ParseHolder(s string) (Holder, bool) {
	p, st, ok := strings.Cut(strings.TrimSpace(s), ".")
	if !ok {
		return Holder{}, false
	}
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(st, 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return Holder{}, false
	}
	return Holder{PID: pid, Start: start}, true
}
