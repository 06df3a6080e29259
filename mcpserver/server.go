// Package mcpserver gives an agent turnsnap's checkpoints as its own MCP
// tools: checkpoint, log, diff, cat, restore_paths, rollback and branch,
// each scoped to one sandbox. An agent that can roll itself back recovers
// from a bad edit in one call instead of undoing it by hand (Crab measured
// 29% less wall-clock and 36% fewer tokens). `turnsnap mcp --sandbox NAME`
// serves the tools over stdio; the daemon serves them over streamable HTTP
// at /v1/sandboxes/{name}/mcp (Handler). Both call the same Service the
// CLI uses, so a tool does what the command of the same name does.
// docs/MCP.md describes the tools for people.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Service is what the tools need of turnsnap: a subset of the CLI's
// service, satisfied by server.Service (an engine in this process) and by
// client.Client (the daemon).
type Service interface {
	Checkpoint(ctx context.Context, name string, req api.CheckpointRequest) (*api.Checkpoint, error)
	Log(ctx context.Context, name string) ([]api.LogEntry, error)
	DiffPaths(ctx context.Context, name string, req api.DiffRequest) (*api.DiffResult, error)
	Cat(ctx context.Context, ref, path string, w io.Writer) error
	RestorePaths(ctx context.Context, name string, req api.RestorePathsRequest) (*api.RestorePathsResult, error)
	Rollback(ctx context.Context, name string, req api.RollbackRequest) (*api.Restore, error)
	Branch(ctx context.Context, ref string, req api.BranchRequest) ([]api.Restore, error)
}

// Options configures New.
type Options struct {
	Logger *slog.Logger
	// Version is the server's version in the MCP handshake.
	Version string
	// SchemaCache, if set, is shared by servers made per request (the
	// daemon's stateless HTTP handler), so the tools' schemas are derived
	// from their Go types once, not on every request.
	SchemaCache *mcp.SchemaCache
}

// Defaults and bounds of the tools' inputs. An agent's context is small:
// a tool answers with a page, and the agent asks for more if it needs it.
const (
	DefaultLogLimit = 50
	DefaultCatBytes = 256 << 10
	MaxCatBytes     = 8 << 20
)

// New returns an MCP server whose tools act on sandbox name through svc.
func New(svc Service, name string, opts Options) *mcp.Server {
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "turnsnap", Title: "turnsnap: checkpoints of sandbox " + name, Version: version},
		&mcp.ServerOptions{Logger: opts.Logger, SchemaCache: opts.SchemaCache,
			// No "logging" capability: the tools log nothing to the client.
			Capabilities: &mcp.ServerCapabilities{},
			Instructions: fmt.Sprintf(`These tools checkpoint and restore the sandbox %q you work in (turnsnap).
Call checkpoint when a step works (tests pass, a feature is done): it is cheap, and free when nothing changed.
When an edit or a command went wrong, call rollback to the last good checkpoint (log lists them) instead of undoing it by hand;
restore_paths brings back only some paths, cat shows a file as it was, diff shows what changed since a checkpoint.
branch makes new sandboxes from a checkpoint, to try alternatives side by side.`, name)})
	t := &tools{svc: svc, name: name}
	yes, no := true, false
	mcp.AddTool(s, &mcp.Tool{Name: "checkpoint", Title: "Checkpoint the sandbox",
		Description: "Record the sandbox's files (and long-lived processes) as they are now, as a new checkpoint to roll back to later. " +
			"A turn that changed nothing writes nothing (class skip) and returns the current head.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}}, t.checkpoint)
	mcp.AddTool(s, &mcp.Tool{Name: "log", Title: "List checkpoints",
		Description: "The sandbox's checkpoints, newest first: id, turn, class, message, time. head marks the one the sandbox is at.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, t.log)
	mcp.AddTool(s, &mcp.Tool{Name: "diff", Title: "What changed",
		Description: "The paths that differ between two states of the sandbox: by default between its head checkpoint and its files now. " +
			"from and to name checkpoints; patch adds unified diffs of text files.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, t.diff)
	mcp.AddTool(s, &mcp.Tool{Name: "cat", Title: "A file as it was",
		Description: "One file's content as it was in a checkpoint. Text comes back as text, anything else as base64; " +
			"at most max_bytes (truncated says when there was more).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, t.cat)
	mcp.AddTool(s, &mcp.Tool{Name: "restore_paths", Title: "Restore some paths",
		Description: "Put the given paths (files or directories, absolute inside the sandbox) back as they were in a checkpoint; " +
			"a path the checkpoint does not have is removed. Everything else, and running processes, stay as they are.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no}}, t.restorePaths)
	mcp.AddTool(s, &mcp.Tool{Name: "rollback", Title: "Roll the sandbox back",
		Description: "Make the whole sandbox (files, and long-lived processes unless fs_only) what it was at a checkpoint. " +
			"Changes since the head checkpoint that were not checkpointed are lost: checkpoint first to keep them.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no}}, t.rollback)
	mcp.AddTool(s, &mcp.Tool{Name: "branch", Title: "Branch into new sandboxes",
		Description: "Make a new sandbox named name from a checkpoint (default: this sandbox's head), or count sandboxes name-1 ... name-count. " +
			"This sandbox is not changed.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}}, t.branch)
	return s
}

type tools struct {
	svc  Service
	name string
}

// toolErr names the error's class (errdefs, as the CLI's --json and the
// API's problems do) first, so an agent can tell a bad reference
// (not_found, invalid) from a busy sandbox (unavailable) without parsing
// prose. The SDK returns it as a tool error (isError), not a protocol one.
func toolErr(err error) error {
	return fmt.Errorf("%s: %w", errdefs.Class(err), err)
}

// CheckpointInput is the checkpoint tool's input.
type CheckpointInput struct {
	Message string `json:"message,omitempty" jsonschema:"what this turn did, kept with the checkpoint"`
	Turn    *int   `json:"turn,omitempty" jsonschema:"the agent's own turn number (default: the parent's plus one)"`
}

// Checkpoint is a closed turn.
type Checkpoint struct {
	Sandbox  string `json:"sandbox"`
	ID       string `json:"id"`
	Parent   string `json:"parent,omitempty"`
	Turn     int    `json:"turn"`
	Class    string `json:"class" jsonschema:"skip (nothing changed: no new checkpoint), fs, process or full"`
	BytesNew int64  `json:"bytes_new" jsonschema:"new bytes this checkpoint stored"`
	Duration string `json:"duration"`
}

func (t *tools) checkpoint(ctx context.Context, _ *mcp.CallToolRequest, in CheckpointInput) (*mcp.CallToolResult, *Checkpoint, error) {
	if in.Turn != nil && *in.Turn < 0 {
		return nil, nil, toolErr(fmt.Errorf("checkpoint sandbox %s: turn %d is negative: %w", t.name, *in.Turn, errdefs.ErrInvalid))
	}
	r, err := t.svc.Checkpoint(ctx, t.name, api.CheckpointRequest{Message: in.Message, Turn: in.Turn})
	if err != nil {
		return nil, nil, toolErr(err)
	}
	return nil, &Checkpoint{Sandbox: r.Sandbox, ID: r.ID.String(), Parent: r.Parent.String(), Turn: r.Turn,
		Class: string(r.Class), BytesNew: r.BytesNew, Duration: api.Dur(r.DurationMS).Round(time.Microsecond).String()}, nil
}

// LogInput is the log tool's input.
type LogInput struct {
	Limit int `json:"limit,omitempty" jsonschema:"at most this many checkpoints, newest first (default 50)"`
}

// LogOutput is the log tool's answer.
type LogOutput struct {
	Sandbox     string     `json:"sandbox"`
	Checkpoints []LogEntry `json:"checkpoints"`
	More        int        `json:"more,omitempty" jsonschema:"older checkpoints not listed (raise limit to see them)"`
}

// LogEntry is one checkpoint of the log.
type LogEntry struct {
	ID       string   `json:"id"`
	Parent   string   `json:"parent,omitempty"`
	Sandbox  string   `json:"sandbox" jsonschema:"the sandbox that made it (an ancestor's, for checkpoints from before a branch)"`
	Turn     int      `json:"turn"`
	Class    string   `json:"class"`
	Message  string   `json:"message,omitempty"`
	Created  string   `json:"created" jsonschema:"RFC 3339 time"`
	BytesNew int64    `json:"bytes_new"`
	Head     bool     `json:"head,omitempty" jsonschema:"the sandbox is at this checkpoint"`
	Branches []string `json:"branches,omitempty" jsonschema:"other sandboxes that continue from it"`
}

func (t *tools) log(ctx context.Context, _ *mcp.CallToolRequest, in LogInput) (*mcp.CallToolResult, *LogOutput, error) {
	if in.Limit < 0 {
		return nil, nil, toolErr(fmt.Errorf("log sandbox %s: limit %d is negative: %w", t.name, in.Limit, errdefs.ErrInvalid))
	}
	limit := in.Limit
	if limit == 0 {
		limit = DefaultLogLimit
	}
	entries, err := t.svc.Log(ctx, t.name)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	out := &LogOutput{Sandbox: t.name, Checkpoints: []LogEntry{}}
	for i, e := range entries {
		if i == limit {
			out.More = len(entries) - limit
			break
		}
		le := LogEntry{ID: e.ID.String(), Parent: e.Parent.String(), Sandbox: e.Sandbox, Turn: e.Turn, Class: string(e.Class),
			Message: e.Message, Created: e.Created.UTC().Format(time.RFC3339Nano), BytesNew: e.BytesNew, Head: e.Head}
		if len(e.Branches) > 0 {
			le.Branches = e.Branches
		}
		out.Checkpoints = append(out.Checkpoints, le)
	}
	return nil, out, nil
}

// DiffInput is the diff tool's input.
type DiffInput struct {
	From  string `json:"from,omitempty" jsonschema:"a checkpoint (id, unique id prefix or tag); default: the sandbox's head"`
	To    string `json:"to,omitempty" jsonschema:"a checkpoint; default: the sandbox's files as they are now (needs from)"`
	Patch bool   `json:"patch,omitempty" jsonschema:"add a unified diff for each changed text file"`
}

// DiffOutput is the diff tool's answer.
type DiffOutput struct {
	Sandbox string   `json:"sandbox"`
	From    string   `json:"from"`
	To      string   `json:"to" jsonschema:"a checkpoint id, or working for the live files"`
	Changes []Change `json:"changes"`
}

// Change is one changed path.
type Change struct {
	Path    string  `json:"path"`
	Change  string  `json:"change" jsonschema:"added, modified or deleted"`
	Type    string  `json:"type" jsonschema:"file, dir, symlink, ..."`
	OldSize *uint64 `json:"old_size,omitempty"`
	NewSize *uint64 `json:"new_size,omitempty"`
	Patch   string  `json:"patch,omitempty"`
	Binary  bool    `json:"binary,omitempty" jsonschema:"a patch was asked for but the file is not text"`
}

func (t *tools) diff(ctx context.Context, _ *mcp.CallToolRequest, in DiffInput) (*mcp.CallToolResult, *DiffOutput, error) {
	r, err := t.svc.DiffPaths(ctx, t.name, api.DiffRequest{From: in.From, To: in.To, Patch: in.Patch})
	if err != nil {
		return nil, nil, toolErr(err)
	}
	out := &DiffOutput{Sandbox: r.Sandbox, From: r.From, To: r.To, Changes: []Change{}}
	for _, p := range r.Paths {
		out.Changes = append(out.Changes, Change{Path: p.Path, Change: p.Change, Type: p.Type, OldSize: p.OldSize,
			NewSize: p.NewSize, Patch: p.Patch, Binary: p.Binary})
	}
	return nil, out, nil
}

// CatInput is the cat tool's input.
type CatInput struct {
	Checkpoint string `json:"checkpoint" jsonschema:"the checkpoint (id, unique id prefix or tag)"`
	Path       string `json:"path" jsonschema:"absolute path inside the sandbox, e.g. /src/main.go"`
	MaxBytes   int    `json:"max_bytes,omitempty" jsonschema:"return at most this many bytes (default 262144, at most 8388608)"`
}

// CatOutput is the cat tool's answer: Text or Base64.
type CatOutput struct {
	Checkpoint string `json:"checkpoint"`
	Path       string `json:"path"`
	Bytes      int    `json:"bytes" jsonschema:"bytes returned"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"the file has more than max_bytes"`
	Text       string `json:"text,omitempty" jsonschema:"the content, when it is UTF-8 text"`
	Base64     string `json:"base64,omitempty" jsonschema:"the content, standard base64, when it is not text"`
}

// capWriter keeps the first max bytes and then refuses more, which stops
// the cat: a tool call never streams a whole large file to throw it away.
type capWriter struct {
	buf  bytes.Buffer
	max  int
	full bool
}

func (w *capWriter) Write(p []byte) (int, error) {
	room := w.max - w.buf.Len()
	if len(p) <= room {
		return w.buf.Write(p)
	}
	w.buf.Write(p[:room])
	w.full = true
	return room, errCapped
}

var errCapped = errors.New("cat: over max_bytes")

func (t *tools) cat(ctx context.Context, _ *mcp.CallToolRequest, in CatInput) (*mcp.CallToolResult, *CatOutput, error) {
	switch {
	case in.Checkpoint == "":
		return nil, nil, toolErr(fmt.Errorf("cat: a checkpoint is needed: %w", errdefs.ErrInvalid))
	case in.MaxBytes < 0 || in.MaxBytes > MaxCatBytes:
		return nil, nil, toolErr(fmt.Errorf("cat %s %s: max_bytes %d is outside 1..%d: %w", in.Checkpoint, in.Path, in.MaxBytes, MaxCatBytes, errdefs.ErrInvalid))
	}
	w := &capWriter{max: in.MaxBytes}
	if w.max == 0 {
		w.max = DefaultCatBytes
	}
	// One byte more than is returned says whether the file has more.
	w.max++
	if err := t.svc.Cat(ctx, in.Checkpoint, in.Path, w); err != nil && !w.full {
		return nil, nil, toolErr(err)
	}
	b := w.buf.Bytes()
	out := &CatOutput{Checkpoint: in.Checkpoint, Path: in.Path}
	if len(b) == w.max {
		b, out.Truncated = b[:w.max-1], true
	}
	out.Bytes = len(b)
	// A cut may split a UTF-8 sequence at the end: text still, minus the
	// partial rune (Bytes says how many were kept).
	text := b
	if out.Truncated {
		for i := 0; i < utf8.UTFMax-1 && len(text) > 0 && !utf8.Valid(text); i++ {
			text = text[:len(text)-1]
		}
	}
	if utf8.Valid(text) && bytes.IndexByte(text, 0) < 0 {
		out.Text, out.Bytes = string(text), len(text)
		// The file itself is the content the model reads, not its JSON.
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out.Text}}}, out, nil
	}
	out.Base64 = base64.StdEncoding.EncodeToString(b)
	return nil, out, nil
}

// RestorePathsInput is the restore_paths tool's input.
type RestorePathsInput struct {
	Checkpoint string   `json:"checkpoint" jsonschema:"the checkpoint to take the paths from (id, unique id prefix or tag)"`
	Paths      []string `json:"paths" jsonschema:"absolute paths inside the sandbox (files or directories)"`
}

// RestorePathsOutput is the restore_paths tool's answer.
type RestorePathsOutput struct {
	Sandbox    string         `json:"sandbox"`
	Checkpoint string         `json:"checkpoint"`
	Paths      []RestoredPath `json:"paths"`
}

// RestoredPath is what happened to one path.
type RestoredPath struct {
	Path   string `json:"path"`
	Action string `json:"action" jsonschema:"restored; removed (the checkpoint does not have it); absent (in neither)"`
	Files  int64  `json:"files"`
	Bytes  int64  `json:"bytes"`
}

func (t *tools) restorePaths(ctx context.Context, _ *mcp.CallToolRequest, in RestorePathsInput) (*mcp.CallToolResult, *RestorePathsOutput, error) {
	if in.Checkpoint == "" || len(in.Paths) == 0 {
		return nil, nil, toolErr(fmt.Errorf("restore_paths sandbox %s: a checkpoint and at least one path are needed: %w", t.name, errdefs.ErrInvalid))
	}
	r, err := t.svc.RestorePaths(ctx, t.name, api.RestorePathsRequest{Checkpoint: in.Checkpoint, Paths: in.Paths})
	if err != nil {
		return nil, nil, toolErr(err)
	}
	out := &RestorePathsOutput{Sandbox: r.Sandbox, Checkpoint: r.Checkpoint.String(), Paths: []RestoredPath{}}
	for _, p := range r.Paths {
		out.Paths = append(out.Paths, RestoredPath{Path: p.Path, Action: p.Action, Files: p.Files, Bytes: p.Bytes})
	}
	return nil, out, nil
}

// RollbackInput is the rollback tool's input.
type RollbackInput struct {
	Checkpoint string `json:"checkpoint" jsonschema:"the checkpoint to go back to (id, unique id prefix or tag)"`
	FSOnly     bool   `json:"fs_only,omitempty" jsonschema:"restore files only; running processes are left alone"`
}

// Restored is one sandbox a rollback or branch left at a checkpoint.
type Restored struct {
	Sandbox    string `json:"sandbox"`
	Checkpoint string `json:"checkpoint"`
	Turn       int    `json:"turn"`
	Processes  bool   `json:"processes" jsonschema:"long-lived processes were restored too"`
	Duration   string `json:"duration"`
}

func restoredOf(r api.Restore) Restored {
	return Restored{Sandbox: r.Sandbox, Checkpoint: r.Checkpoint.String(), Turn: r.Turn, Processes: r.Processes,
		Duration: api.Dur(r.DurationMS).Round(time.Microsecond).String()}
}

func (t *tools) rollback(ctx context.Context, _ *mcp.CallToolRequest, in RollbackInput) (*mcp.CallToolResult, *Restored, error) {
	if in.Checkpoint == "" {
		return nil, nil, toolErr(fmt.Errorf("rollback sandbox %s: a checkpoint is needed: %w", t.name, errdefs.ErrInvalid))
	}
	// Not cancelled with the call: a rollback stops every process of the
	// sandbox, so an agent that runs inside it and asked for the rollback
	// hangs up halfway (docs/PROCESSES.md, "The agent's own processes").
	r, err := t.svc.Rollback(context.WithoutCancel(ctx), t.name, api.RollbackRequest{Checkpoint: in.Checkpoint, FSOnly: in.FSOnly})
	if err != nil {
		return nil, nil, toolErr(err)
	}
	out := restoredOf(*r)
	return nil, &out, nil
}

// BranchInput is the branch tool's input.
type BranchInput struct {
	Name       string `json:"name" jsonschema:"the new sandbox's name (with count: the prefix of name-1 ... name-count)"`
	Checkpoint string `json:"checkpoint,omitempty" jsonschema:"the checkpoint to branch from (id, unique id prefix or tag); default: this sandbox's head"`
	Count      int    `json:"count,omitempty" jsonschema:"make this many sandboxes, name-1 ... name-count (at most 256)"`
}

// BranchOutput is the branch tool's answer.
type BranchOutput struct {
	Sandboxes []Restored `json:"sandboxes"`
}

func (t *tools) branch(ctx context.Context, _ *mcp.CallToolRequest, in BranchInput) (*mcp.CallToolResult, *BranchOutput, error) {
	if in.Count < 0 || in.Count > api.MaxBranchCount {
		return nil, nil, toolErr(fmt.Errorf("branch sandbox %s: count %d is outside 0..%d: %w", t.name, in.Count, api.MaxBranchCount, errdefs.ErrInvalid))
	}
	ref := in.Checkpoint
	if ref == "" {
		// The head as an id: what the log says, so no reference syntax is
		// assumed of the engine.
		entries, err := t.svc.Log(ctx, t.name)
		if err != nil {
			return nil, nil, toolErr(err)
		}
		for _, e := range entries {
			if e.Head {
				ref = e.ID.String()
				break
			}
		}
		if ref == "" {
			return nil, nil, toolErr(fmt.Errorf("branch sandbox %s: it has no checkpoint yet (call checkpoint first): %w", t.name, errdefs.ErrPrecondition))
		}
	}
	rs, err := t.svc.Branch(ctx, ref, api.BranchRequest{Name: in.Name, Count: in.Count})
	if err != nil {
		return nil, nil, toolErr(err)
	}
	out := &BranchOutput{Sandboxes: []Restored{}}
	for _, r := range rs {
		out.Sandboxes = append(out.Sandboxes, restoredOf(r))
	}
	return nil, out, nil
}
