package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strconv"

	"github.com/turnsnap/turnsnap/proc/ocispec"
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

// AgentStateDir is where an agent inside its sandbox keeps its own state
// (HOME, TMPDIR, XDG directories, CLAUDE_CONFIG_DIR): a tmpfs of the
// container's own, not in the sandbox root, left out of the tmpfs digests
// and emptied after a restore (ocispec.AgentStateDir, docs/PROCESSES.md
// "The agent's own processes"). `turnsnap exec --agent` points the agent
// there (AgentArgv).
const AgentStateDir = ocispec.AgentStateDir

// AgentArgv is argv started as the agent: env(1) marks it (AgentEnv) and
// points its home, temporary and XDG directories and Claude Code's config
// directory at AgentStateDir. Variables set by argv itself (an inner
// `env HOME=...`) still win.
func AgentArgv(argv []string) []string {
	d := AgentStateDir
	return append([]string{"env", AgentEnv, "HOME=" + d, "TMPDIR=" + d, // exists: the mount point itself
		"XDG_CONFIG_HOME=" + d + "/.config", "XDG_CACHE_HOME=" + d + "/.cache",
		"XDG_DATA_HOME=" + d + "/.local/share", "XDG_STATE_HOME=" + d + "/.local/state",
		"CLAUDE_CONFIG_DIR=" + d + "/.claude"}, argv...)
}

// clearAgentState empties the agent's tmpfs (AgentStateDir) of the
// container whose init is host pid. CRIU dumps every tmpfs of the
// container's mount namespace, the agent's included, and restores its
// contents; emptied, a restored container holds no agent state, as a new
// one does: the agent started again after a rollback finds none. The
// walk stays in the container's root (os.Root), whatever links a process
// of the sandbox left there. A container without the mount (one started
// before it was added) has nothing to empty.
func clearAgentState(hostPID int) error {
	root, err := os.OpenRoot(fmt.Sprintf("/proc/%d/root", hostPID))
	if err != nil {
		return err
	}
	defer root.Close()
	dir, err := root.OpenRoot(AgentStateDir[1:])
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	f, err := dir.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := dir.RemoveAll(name); err != nil {
			return err
		}
	}
	return nil
}

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
