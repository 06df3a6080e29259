package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/proc"
)

// routeProbe asks, from inside sandbox name, for path on the daemon's
// route (proc.AgentLLMAddr): the status and the start of the body, or
// ERR when nothing answers.
const routeProbe = `import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://` + proc.AgentLLMAddr + `" + sys.argv[1], timeout=10)
    print(r.status, r.read(200))
except urllib.error.HTTPError as e:
    print(e.code, e.read(200))
except Exception as e:
    print("ERR", e)
`

// The daemon's route inside a sandbox serves that sandbox's proxy only:
// a request naming another sandbox of the home is refused, and the route
// comes back after a rollback that recreated the container (a new
// network namespace).
func TestAgentInsideRouteOwnSandboxOnly(t *testing.T) {
	testenv.RequireRoot(t)
	in := insideSetup(t, "ra")
	mustCLI(t, in.home, "sandbox", "create", "rb", "--base", filepath.Join(filepath.Dir(in.home), "base"))
	t.Cleanup(func() { cliRun(t, in.home, "sandbox", "rm", "rb") })
	d := startDaemon(t, in.home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", in.ms.Script("route", modelserver.Say("hi")))
	probe := func(path string) string {
		t.Helper()
		out, _ := mustCLI(t, in.home, "exec", "ra", "--", "python3", "-c", routeProbe, path)
		return strings.TrimSpace(out)
	}
	refused := func(out string) bool {
		return strings.HasPrefix(out, "403 ") && strings.Contains(out, "Not this sandbox")
	}
	check := func(when string) {
		t.Helper()
		own := probe("/llm/ra/v1/models")
		if strings.HasPrefix(own, "ERR") || refused(own) {
			t.Fatalf("%s: sandbox ra's own route: %s\ndaemon: %s", when, own, tail(d.stderr.String()))
		}
		for _, p := range []string{"/llm/rb/v1/models", "/llm/rb/v1/messages", "/llm/ra%2F..%2Frb/v1/models", "/v1/sandboxes", "/v1/sandboxes/rb/mcp", "/metrics"} {
			if out := probe(p); !refused(out) {
				t.Errorf("%s: from inside ra, %s answered %s, want refused", when, p, out)
			}
		}
		t.Logf("%s: own route: %s", when, own)
	}
	check("started")
	netns := func() [2]uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(in.netns(), &st); err != nil {
			t.Fatalf("the container's network namespace: %v", err)
		}
		return [2]uint64{uint64(st.Dev), st.Ino}
	}
	// A process turn, then a file turn; the rollback to the first brings
	// its processes back in a restored container.
	mustCLI(t, in.home, "exec", "ra", "--detach", "--", "sleep", "1000")
	var c1 struct{ ID, Class string }
	out, _ := mustCLI(t, in.home, "checkpoint", "ra", "--json")
	if err := json.Unmarshal([]byte(out), &c1); err != nil || c1.Class == "skip" {
		t.Fatalf("checkpoint: %s %v", out, err)
	}
	os.WriteFile(filepath.Join(in.root, "proj/two.txt"), []byte("two\n"), 0o644)
	mustCLI(t, in.home, "checkpoint", "ra")
	before := netns()
	mustCLI(t, in.home, "rollback", "ra", c1.ID)
	if after := netns(); after == before {
		t.Fatalf("the rollback kept the container's network namespace (class %s): nothing tested", c1.Class)
	}
	check("after the rollback")
}
