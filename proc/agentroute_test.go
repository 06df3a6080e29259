package proc

import (
	"slices"
	"testing"
)

// The agent's base URLs come before its argv: env(1) lets a later
// assignment (the user's own) win.
func TestAgentLLMEnv(t *testing.T) {
	got := AgentLLMEnv("a1")
	want := []string{"ANTHROPIC_BASE_URL=http://" + AgentLLMAddr + "/llm/a1", "OPENAI_BASE_URL=http://" + AgentLLMAddr + "/llm/a1/v1"}
	if !slices.Equal(got, want) {
		t.Fatalf("AgentLLMEnv = %q, want %q", got, want)
	}
}
