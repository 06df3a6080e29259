package proc

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may set it.
	line := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 120 0 3 0 7 5 0 0 20 0 2 0 98765 1000 256 18446744073709551615"
	st, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.comm != "a (b) c" || st.state != 'S' || st.ppid != 1 || st.pgrp != 4242 || st.session != 4242 ||
		st.minflt != 120 || st.majflt != 3 || st.utime != 7 || st.stime != 5 || st.threads != 2 ||
		st.start != 98765 || st.rssPages != 256 {
		t.Errorf("parsed %+v", st)
	}
	if _, err := parseStat([]byte("12 (x) S 1")); err == nil {
		t.Error("short stat accepted")
	}
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := parseStat(self); err != nil || st.start == 0 || st.threads == 0 {
		t.Errorf("own stat: %+v %v", st, err)
	}
}

func TestProcfsHelpers(t *testing.T) {
	if got := nsPID([]byte("Name:\tsh\nNSpid:\t31305\t1\nPPid:\t0\n")); got != 1 {
		t.Errorf("nsPID = %d", got)
	}
	if got := cmdline([]byte("sh\x00-c\x00echo hi\x00")); !slices.Equal(got, []string{"sh", "-c", "echo hi"}) {
		t.Errorf("cmdline = %q", got)
	}
	if got := cmdline(nil); got != nil {
		t.Errorf("kernel thread cmdline = %q", got)
	}
	if got := cpuFlags([]byte("processor\t: 0\nflags\t\t: sse2 fpu avx2 fpu\n\nprocessor\t: 1\nflags\t\t: other\n")); !slices.Equal(got, []string{"avx2", "fpu", "sse2"}) {
		t.Errorf("cpuFlags = %q", got)
	}
	if !descendsFrom(5, 1, func(p int) (int, bool) { return map[int]int{5: 3, 3: 1}[p], p != 1 }) {
		t.Error("5 -> 3 -> 1 not seen as a descendant of 1")
	}
	if descendsFrom(5, 1, func(p int) (int, bool) { return map[int]int{5: 9}[p], p == 5 }) {
		t.Error("5 -> 9 (outside) seen as a descendant of 1")
	}
}

func TestRuncMessage(t *testing.T) {
	if got := runcMessage([]byte(`time="x" level=error msg="container \"x\" does not exist"`), nil); got != `container \"x\" does not exist` {
		t.Errorf("runcMessage = %q", got)
	}
}

// The container's defaults (the keeper as init, hostname "sandbox") reach
// its config, and container ids that could escape a path are refused.
func TestSpecDefaultsAndIDs(t *testing.T) {
	s := specFor("/srv/sandbox/root", "/run/ts/netns/a", "/turnsnap/abc-a", StartOptions{})
	if !strings.Contains(strings.Join(s.Process.Args, " "), keeperMarker) || s.Hostname != "sandbox" {
		t.Errorf("defaults: args %q hostname %q", s.Process.Args, s.Hostname)
	}
	for _, bad := range []string{"", "../x", "a/b", "-x", strings.Repeat("a", 129)} {
		if checkID(bad) == nil {
			t.Errorf("id %q accepted", bad)
		}
	}
}
