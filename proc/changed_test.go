package proc

import (
	"strings"
	"testing"
	"time"
)

func TestChangedRules(t *testing.T) {
	idle := Process{PID: 7, Start: 100, Cmdline: []string{"httpd", "-f"}, Threads: 1,
		RunTime: time.Millisecond, Slices: 10, VoluntaryCtxt: 9, ReadChars: 100}
	set := func(ps ...Process) ProcSet { return ProcSet{Procs: ps} }
	with := func(f func(*Process)) Process { p := idle; f(&p); return p }

	for _, tc := range []struct {
		name      string
		prev, cur ProcSet
		want      bool
		why       string
	}{
		{"nothing at all", set(), set(), false, ""},
		{"same idle process", set(idle), set(idle), false, ""},
		{"appeared", set(), set(idle), true, "appeared"},
		{"exited", set(idle), set(), true, "exited"},
		{"pid reused", set(idle), set(with(func(p *Process) { p.Start = 200 })), true, "replaced"},
		{"exec'd", set(idle), set(with(func(p *Process) { p.Cmdline = []string{"node"} })), true, "now runs"},
		{"ran briefly", set(idle), set(with(func(p *Process) { p.RunTime += 2 * time.Microsecond; p.Slices++ })), true, "on CPU"},
		{"read a socket", set(idle), set(with(func(p *Process) { p.ReadChars += 5 })), true, "bytes read"},
		{"new thread", set(idle), set(with(func(p *Process) { p.Threads = 2 })), true, "threads"},
		{"counters went down", set(idle), set(with(func(p *Process) { p.Slices = 1 })), true, "fewer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := Changed(tc.prev, tc.cur)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("Changed = %v %q, want %v mentioning %q", got, why, tc.want, tc.why)
			}
		})
	}

	// Many changes: the reason stays short.
	var many ProcSet
	for i := range 10 {
		many.Procs = append(many.Procs, Process{PID: i + 2, Cmdline: []string{"sleep", "1"}})
	}
	if _, why := Changed(ProcSet{}, many); !strings.Contains(why, "and 7 more") {
		t.Errorf("reason %q does not summarise", why)
	}
}
