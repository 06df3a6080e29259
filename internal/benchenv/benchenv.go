// Package benchenv is what every benchmark of the project shares: its size
// (full, or small for the one run `make test` gives each benchmark so it
// cannot rot) and the machine's load, which every benchmark reports beside
// its figures because the machines are shared (docs/BENCH.md).
package benchenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// SmallVar is the environment variable `make test` sets for its 1x run of
// every benchmark.
const SmallVar = "TURNSNAP_BENCH_SMALL"

// Small reports whether benchmarks run at their small size.
func Small() bool { return os.Getenv(SmallVar) != "" }

// Size is full, or small under SmallVar.
func Size(full, small int) int {
	if Small() {
		return small
	}
	return full
}

// Load1 is the 1-minute load average (/proc/loadavg's first field).
func Load1(tb testing.TB) float64 {
	tb.Helper()
	l, err := ReadLoad1()
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// ReadLoad1 is Load1 for callers without a testing.TB.
func ReadLoad1() (float64, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/loadavg: empty")
	}
	return strconv.ParseFloat(f[0], 64)
}
