package harness

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sampleLoad samples the 1-minute load average every 5 s into h until the
// returned stop is called (stop may be called more than once).
func sampleLoad(h *Host) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		defer close(finished)
		var sum float64
		n := 0
		take := func() {
			if l := loadavg(); len(l) > 0 {
				sum += l[0]
				n++
				h.Load1Max = max(h.Load1Max, l[0])
				h.Load1Mean = sum / float64(n)
			}
		}
		take()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				take()
			case <-done:
				return
			}
		}
	}()
	return func() { once.Do(func() { close(done); <-finished }) }
}

func loadavg() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	var out []float64
	for _, f := range strings.Fields(string(b))[:3] {
		v, _ := strconv.ParseFloat(f, 64)
		out = append(out, v)
	}
	return out
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
