package proc

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// StartedAt is when the process started, from its start ticks and the
// host's boot time (/proc/stat btime); zero if the boot time is unreadable.
// After a restore it is when CRIU recreated the process.
func (p Process) StartedAt() time.Time {
	bt := bootTime()
	if bt.IsZero() {
		return time.Time{}
	}
	return bt.Add(time.Duration(p.Start) * clockTick)
}

func bootTime() time.Time {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}
