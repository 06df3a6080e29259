package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// Claude Code as the MCP host (issue 26, part 3): `turnsnap mcp` is its
// stdio MCP server, scoped to the sandbox it works in, and the scripted
// model asks it to checkpoint, then, after a destructive mistake, to roll
// the sandbox back through the rollback tool; the agent goes on and reads
// the restored files. The agent runs on the host
// in the sandbox's root, straight against the model (no proxy: the
// checkpoints are the agent's own calls).
func TestAgentClaudeCodeMCPRollback(t *testing.T) {
	testenv.RequireRoot(t)
	a := claudeCode(t)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	writeProject(t, base)
	var created struct{ Root string }
	out, _ := mustCLI(t, home, "sandbox", "create", "m", "--base", base, "--json")
	json.Unmarshal([]byte(out), &created)
	root := created.Root
	t.Cleanup(func() { cliRun(t, home, "sandbox", "rm", "m") })
	// Through a daemon, as a platform runs it: its rollback of files the
	// agent made is written through the mounted root. Without one, or when
	// the rollback must bring back a file of the base or a directory the
	// sandbox made (overlay marks it opaque), the root is unmounted and
	// remounted, which the agent's cwd in the root refuses ("root ... is
	// busy"): docs/PROCESSES.md, "The agent's own processes".
	d := startDaemon(t, home, nil)

	// The MCP server is this test binary acting as turnsnap (runMainEnv).
	cfg := map[string]any{"mcpServers": map[string]any{"turnsnap": map[string]any{
		"type": "stdio", "command": os.Args[0], "args": []string{"--home", home, "mcp", "--sandbox", "m"},
		"env": map[string]string{runMainEnv: "1"},
	}}}
	cfgPath := filepath.Join(dir, "mcp.json")
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a.script = strings.Replace(a.script, " -p ", " --mcp-config "+cfgPath+" --strict-mcp-config -p ", 1)
	// Claude Code defers MCP tools behind its ToolSearch tool by default
	// (their schemas come only once the model searched for them); the
	// scripted model calls the tool straight away, as a model that was
	// given the schemas would.
	a.env = append(a.env, "ENABLE_TOOL_SEARCH=false")

	ms := modelserver.New(nil)
	t.Cleanup(ms.Close)
	url := ms.Script("mcp",
		modelserver.Bash("echo good > good.txt && echo draft > draft.txt"),
		modelserver.Tool("mcp__turnsnap__checkpoint", map[string]any{"message": "good.txt written"}),
		modelserver.Bash("rm good.txt draft.txt"), // the mistake
		modelserver.Tool("mcp__turnsnap__rollback", map[string]any{"checkpoint": "HEAD"}),
		modelserver.Bash("cat good.txt draft.txt"),
		modelserver.Say("rolled back"),
	)
	run := startAgent(t, a.directCmd(root, url, "write good.txt, checkpoint, and undo any mistake"))()
	if run.code != 0 || ms.ModelCalls("mcp") != 6 {
		t.Fatalf("claude-code with turnsnap mcp: %d model calls (want 6)\n%s", ms.ModelCalls("mcp"), run)
	}

	// Every call after the first offered the tools (so the scripted calls
	// were the agent's to make), and the results the agent read back are
	// the tools' own: the checkpoint's class, the rollback's checkpoint, the
	// restored files.
	var calls []modelserver.Request
	for _, r := range ms.Requests() {
		if r.Script == "mcp" && r.Step >= 0 {
			calls = append(calls, r)
		}
	}
	if !strings.Contains(string(calls[0].Body), `"mcp__turnsnap__rollback"`) {
		t.Fatalf("the model was not offered turnsnap's rollback tool: %.2000s", calls[0].Body)
	}
	// Call n holds the result of reply n-1's tool.
	if body := string(calls[2].Body); !strings.Contains(body, `\"class\":\"fs\"`) {
		t.Fatalf("the checkpoint tool's result is not an fs checkpoint:\n%s", toolResults(body))
	}
	if body := string(calls[4].Body); strings.Contains(body, `"is_error":true`) || !strings.Contains(body, `\"checkpoint\":`) {
		t.Fatalf("the rollback tool failed or said nothing:\n%s\ndaemon: %s", toolResults(body), d.stderr)
	}
	if body := string(calls[5].Body); !strings.Contains(body, `good\ndraft`) {
		t.Fatalf("after the rollback the agent's cat did not see the files:\n%s", toolResults(body))
	}

	// The sandbox is at the checkpoint the agent took: the mistake is gone.
	if fileOr(filepath.Join(root, "good.txt")) != "good\n" || fileOr(filepath.Join(root, "draft.txt")) != "draft\n" {
		t.Fatalf("after the agent's rollback good.txt = %q, draft.txt = %q",
			fileOr(filepath.Join(root, "good.txt")), fileOr(filepath.Join(root, "draft.txt")))
	}
	log, _ := mustCLI(t, home, "log", "m", "--json")
	var entries []struct {
		Message string
		Head    bool
	}
	json.Unmarshal([]byte(log), &entries)
	if len(entries) == 0 || !entries[0].Head || entries[0].Message != "good.txt written" {
		t.Fatalf("log after the rollback: %+v (want the agent's checkpoint as the head)", entries)
	}
}

// toolResults cuts a request body down to its last messages for a failure
// message.
func toolResults(body string) string {
	if i := strings.LastIndex(body, `"tool_result"`); i >= 0 {
		body = body[i:]
	}
	if len(body) > 2000 {
		body = body[:2000]
	}
	return body
}
