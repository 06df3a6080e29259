package proc

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
)

// AgentEnv, in the environment of a command started through Exec, marks
// it as the agent's own process: an agent that runs inside its sandbox
// (docs/PROCESSES.md, "The agent's own processes"). Such a command and
// its descendants that still have it as an ancestor are not sandbox
// state: Snapshot leaves them out of ProcSet.Procs (so they make no turn a
// process turn) and lists them in ProcSet.Agent, and a dump leaves them
// out of the image. Only a process whose parent is outside the container
// (a command runc exec started, still running) can be the agent: nothing
// the sandbox starts itself can hide from a checkpoint this way, and a
// process the agent started to live on (a dev server in the background)
// is adopted by the container's init once its shell exits, and is
// sandbox state like any other.
const AgentEnv = "TURNSNAP_AGENT=1"

// isAgentRoot reports whether host pid's environment holds AgentEnv. The
// environment is the one the process was started with.
func isAgentRoot(hostPID int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", hostPID))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(bytes.Split(b, []byte{0}), func(kv []byte) bool { return string(kv) == AgentEnv })
}

// outsideRoot is the ancestor of host pid whose parent is not in the
// container (parent gives the parent of a pid in the container).
func outsideRoot(pid int, parent func(int) (int, bool)) int {
	for range 4096 {
		pp, ok := parent(pid)
		if !ok {
			return pid
		}
		if _, in := parent(pp); !in {
			return pid
		}
		pid = pp
	}
	return pid
}

// unexpectedRE finds the processes CRIU met in the freezer cgroup but
// not in the tree it dumped (host pids).
var unexpectedRE = regexp.MustCompile(`Unexpected process (\d+)`)

// leftOut lists the processes a dump log says CRIU left out, other than
// the agent's (host pids in agent).
func leftOut(log []byte, agent []int) []int {
	var out []int
	for _, m := range unexpectedRE.FindAllSubmatch(log, -1) {
		pid, err := strconv.Atoi(string(m[1]))
		if err == nil && !slices.Contains(agent, pid) {
			out = append(out, pid)
		}
	}
	return out
}
