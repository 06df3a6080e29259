package llmproxy

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// RouteURL is sandbox's route on the proxy listening at base
// (http://HOST:PORT): base/llm/{sandbox}.
func RouteURL(base, sandbox string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("llm proxy address %q: want http://HOST:PORT: %w", base, errdefs.ErrInvalid)
	}
	if !delta.ValidRefName(sandbox) {
		return "", fmt.Errorf("sandbox name %q: %w", sandbox, errdefs.ErrInvalid)
	}
	return strings.TrimSuffix(u.String(), "/") + "/llm/" + sandbox, nil
}

// AgentEnv returns environ (KEY=VALUE strings, as os.Environ gives them)
// with the variables that send an unmodified agent's model calls through
// sandbox's route, replacing any earlier value:
//
//   - OPENAI_BASE_URL: read by the OpenAI SDKs (Python >= 1.0, Node, Go);
//     their base URL includes /v1.
//   - OPENAI_API_BASE: the same for openai-python < 1.0 and LangChain.
//   - ANTHROPIC_BASE_URL: read by the Anthropic SDKs and Claude Code; they
//     append /v1/messages themselves.
//   - TURNSNAP_SANDBOX, TURNSNAP_LLM_URL: for agents that want to know.
//
// API keys are the agent's own and pass through the proxy untouched.
func AgentEnv(environ []string, base, sandbox string) ([]string, error) {
	route, err := RouteURL(base, sandbox)
	if err != nil {
		return nil, err
	}
	set := [][2]string{
		{"OPENAI_BASE_URL", route + "/v1"},
		{"OPENAI_API_BASE", route + "/v1"},
		{"ANTHROPIC_BASE_URL", route},
		{"TURNSNAP_SANDBOX", sandbox},
		{"TURNSNAP_LLM_URL", route},
	}
	out := make([]string, 0, len(environ)+len(set))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		replaced := false
		for _, s := range set {
			if k == s[0] {
				replaced = true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	for _, s := range set {
		out = append(out, s[0]+"="+s[1])
	}
	return out, nil
}
