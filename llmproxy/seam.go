// Package llmproxy turns an agent's own model traffic into turn boundaries.
//
// An unmodified agent points its model SDK at
// http://ADDR/llm/{sandbox}/ (see AgentEnv). Every model call that continues
// the conversation (POST .../chat/completions, .../responses,
// .../completions, .../messages) closes the sandbox's turn: the proxy
// forwards the request to the upstream at once and starts the sandbox's
// checkpoint concurrently, so the checkpoint runs inside the model's
// latency. The reply is held at a gate until the checkpoint is committed
// (locally, or remotely durable), then streamed to the agent unchanged.
// Each completed exchange is journaled so that an agent restarted after a
// rollback can replay its conversation without calling the model again for
// the turns the restored state already holds.
//
// The proxy owns no checkpoint or storage logic: it reaches the daemon
// through two small interfaces declared here, Turns and Journal.
// docs/LLM-PROXY.md describes the routes, the turn rule, the gate and the
// journal's matching rule.
package llmproxy

import (
	"context"

	"github.com/turnsnap/turnsnap/delta"
)

// Turn is one model call that closes a sandbox's turn.
type Turn struct {
	Sandbox string
	// Number is the conversation's position (Request.Turn): the assistant
	// turns it already holds. -1 means the request does not say; the
	// daemon then numbers the checkpoint as its parent's turn plus one.
	Number int
	// Conv is the conversation hash, for the record to keep: `turnsnap log`
	// can then say which model call each checkpoint precedes.
	Conv  delta.ID
	Shape Shape
	// Urgent is closed when the model's reply is ready and waits at the gate
	// for this checkpoint: the scheduler (and, for the remote gate, the
	// upload queue) should move it to the urgent lane.
	Urgent <-chan struct{}
}

// Committed names the checkpoint that closed a turn.
type Committed struct {
	ID    delta.ID
	Class string // skip, fs, process, full
}

// Turns takes the checkpoints the proxy asks for. The daemon implements it
// over the engine and its scheduler.
type Turns interface {
	// Checkpoint closes t's turn and returns once the checkpoint is
	// committed locally. It runs concurrently with the model call; ctx is not
	// the agent's request (a client that hangs up does not abort a turn) and
	// ends when the proxy closes.
	Checkpoint(ctx context.Context, t Turn) (Committed, error)
	// WaitRemote returns once c is durable in the remote store. Only the
	// remote gate calls it, after Checkpoint returned.
	WaitRemote(ctx context.Context, t Turn, c Committed) error
}

// Journal keeps each sandbox's model exchanges, keyed by conversation hash.
// TreeJournal (the daemon's) and StoreJournal implement it.
//
// Recording and answering are separate: every complete exchange is
// recorded (Put), but an exchange answers a call only while the sandbox is
// re-run after a restore (docs/LLM-PROXY.md, "When the journal answers"):
// Reset arms the restored exchanges, TakeRerun uses one up, and Live ends
// the re-run at the first call that goes to the model.
type Journal interface {
	// Put records a complete, successful exchange of sandbox. It never
	// makes the exchange answer a call on the timeline that recorded it.
	Put(ctx context.Context, sandbox string, e *Entry) error
	// Get returns the exchange of sandbox whose request had conversation
	// hash conv, or (nil, nil) if the sandbox's current journal has none.
	// After a rollback the daemon resets the journal to the one the restored
	// checkpoint references (TreeJournal.Reset), so Get never answers for a
	// turn the restored state does not hold.
	Get(ctx context.Context, sandbox string, conv delta.ID) (*Entry, error)
	// Rerunning says that a restored exchange of sandbox may still answer
	// a call: only then does the proxy read a call's conversation before
	// forwarding it.
	Rerunning(sandbox string) bool
	// TakeRerun says whether the restored exchange for conv may answer
	// this call, and uses it up: each answers at most once per restore.
	TakeRerun(sandbox string, conv delta.ID) bool
	// Live ends sandbox's re-run: a call went to the model.
	Live(sandbox string)
}

// Entry is one journaled exchange: a model call and the reply the agent got.
type Entry struct {
	Conv   delta.ID // the request's conversation hash
	Turn   int      // the request's position (Request.Turn)
	Shape  Shape
	Stream bool // the reply is raw server-sent events, replayed as such
	Status int
	// ContentType and ContentEncoding are the reply's headers of that name;
	// no other header is kept (never anything that could carry a secret).
	ContentType     string
	ContentEncoding string
	Request         []byte // the request body, verbatim
	Response        []byte // the reply body, verbatim (raw SSE bytes for a stream)
}
