package proc

import (
	"slices"
	"strings"
	"testing"
)

// Compare: a process the init parents must run; a running shell's child
// may come and go; a command or a listener that differs is missing.
func TestInventoryCompare(t *testing.T) {
	image := Inventory{Procs: []InventoryProc{{PID: 1, Comm: "sh"}, {PID: 7, PPID: 1, Comm: "sh"},
		{PID: 9, PPID: 7, Comm: "sleep"}, {PID: 12, PPID: 1, Comm: "httpd"}}, Listening: []string{"tcp6:8080"}}
	same := image
	if m, c := image.Compare(same); len(m) != 0 || len(c) != 0 {
		t.Fatalf("equal inventories: missing %v churn %v", m, c)
	}
	churned := Inventory{Procs: []InventoryProc{{PID: 1, Comm: "sh"}, {PID: 7, PPID: 1, Comm: "sh"},
		{PID: 10, PPID: 7, Comm: "sleep"}, {PID: 12, PPID: 1, Comm: "httpd"}}, Listening: []string{"tcp6:8080"}}
	if m, c := image.Compare(churned); len(m) != 0 || len(c) != 2 {
		t.Fatalf("a shell's child replaced: missing %v churn %v", m, c)
	}
	execd := Inventory{Procs: []InventoryProc{{PID: 1, Comm: "sh"}, {PID: 7, PPID: 1, Comm: "sh"},
		{PID: 9, PPID: 7, Comm: "usleep"}, {PID: 12, PPID: 1, Comm: "httpd"}}, Listening: []string{"tcp6:8080"}}
	if m, c := image.Compare(execd); len(m) != 0 || len(c) != 1 {
		t.Fatalf("a shell's child exec'd: missing %v churn %v", m, c)
	}
	// A restored process that binds a port after the restore (it was
	// dumped while starting) adds to the image: churn, not a loss.
	bound := Inventory{Procs: image.Procs, Listening: []string{"tcp6:8080", "tcp:8000"}}
	if m, c := image.Compare(bound); len(m) != 0 || len(c) != 1 || !strings.Contains(c[0], "tcp:8000") {
		t.Fatalf("a listener opened after the restore: missing %v churn %v", m, c)
	}
	for _, tc := range []struct {
		name string
		got  Inventory
		want string
	}{
		{"server gone", Inventory{Procs: image.Procs[:3], Listening: []string{"tcp6:8080"}}, "process 12 (httpd) not running"},
		{"listener gone", Inventory{Procs: image.Procs}, "socket tcp6:8080 not listening"},
		{"another command", Inventory{Procs: []InventoryProc{{PID: 1, Comm: "sh"}, {PID: 7, PPID: 1, Comm: "sh"},
			{PID: 9, PPID: 7, Comm: "sleep"}, {PID: 12, PPID: 1, Comm: "nc"}}, Listening: []string{"tcp6:8080"}}, `process 12 is "nc"`},
		{"an orphan started", Inventory{Procs: append(slices.Clone(image.Procs), InventoryProc{PID: 30, PPID: 1, Comm: "nc"}),
			Listening: []string{"tcp6:8080"}}, "process 30 (nc) is not in the image"},
		{"the shell gone with its child", Inventory{Procs: []InventoryProc{{PID: 1, Comm: "sh"}, {PID: 12, PPID: 1, Comm: "httpd"}},
			Listening: []string{"tcp6:8080"}}, "process 9 (sleep) not running"},
	} {
		m, _ := image.Compare(tc.got)
		if !slices.ContainsFunc(m, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: missing %v, want %q among them", tc.name, m, tc.want)
		}
	}
}
