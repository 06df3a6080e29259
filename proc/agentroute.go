package proc

// AgentLLMAddr is where an agent inside its sandbox reaches the daemon's
// LLM proxy: an address on the container's own loopback, where the daemon
// (serve --llm-listen) opens a listener whenever it finds the container
// started or restored (docs/LLM-PROXY.md, "An agent inside its
// sandbox"). It is one fixed address, whatever --llm-listen is, so that
// `turnsnap exec --agent` can name it without asking the daemon; a port
// below the kernel's ephemeral range, so no connection of the sandbox's
// own takes it by chance.
const AgentLLMAddr = "127.0.0.1:7180"

// AgentLLMEnv is the environment pointing an agent inside sandbox at the
// daemon's LLM proxy through AgentLLMAddr: the base URLs of the
// Anthropic and OpenAI SDKs (docs/LLM-PROXY.md, "Routes"). As arguments
// of env(1) before the agent's own argv, variables the user sets there
// still win.
func AgentLLMEnv(sandbox string) []string {
	base := "http://" + AgentLLMAddr + "/llm/" + sandbox
	return []string{"ANTHROPIC_BASE_URL=" + base, "OPENAI_BASE_URL=" + base + "/v1"}
}

// NetnsPath is where the network namespace of container id is pinned
// while the container exists: a restore replaces it with a new one.
func (r *Runtime) NetnsPath(id string) string { return r.netnsPath(id) }
