package llmproxy

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Replay says when a sandbox's journal may answer its model calls instead
// of the model (docs/LLM-PROXY.md, "When the journal answers").
type Replay string

const (
	// ReplayAuto, the default, answers only a re-run after a restore: the
	// exchanges the restored checkpoint holds, each at most once, until the
	// first call that goes to the model.
	ReplayAuto Replay = "auto"
	// ReplayOff never answers from the journal; exchanges are still
	// recorded, so a later setting or request may use them.
	ReplayOff Replay = "off"
	// ReplayAlways answers from any exchange the sandbox's journal holds,
	// recorded live or restored: an explicit opt-in, per request only
	// (ReplayHeader: replay).
	ReplayAlways Replay = "always"
)

// ReplayHeader is the request header that chooses, for one model call,
// whether the journal may answer it: "off", "auto", or "replay"
// (ReplayAlways). The proxy removes it before forwarding. A reply from the
// journal carries the same header with the value "replay".
const ReplayHeader = "X-Turnsnap-Journal"

// ParseReplay reads a per-sandbox replay setting ("" is auto). Always is a
// per-request choice, not a setting: a sandbox set to replay every repeated
// call would hand a live agent's retries the reply it is retrying.
func ParseReplay(s string) (Replay, error) {
	switch r := Replay(s); r {
	case "", ReplayAuto:
		return ReplayAuto, nil
	case ReplayOff:
		return r, nil
	}
	return "", fmt.Errorf("llm replay %q: want auto or off: %w", s, errdefs.ErrInvalid)
}

// replayFor decides the replay mode of one model call: the request header,
// then the sandbox's setting. A setting of off is final (an operator's
// guarantee that the sandbox's calls always reach the model).
func (p *Proxy) replayFor(r *http.Request, sandbox string) (Replay, error) {
	setting := ReplayAuto
	if p.opts.ReplayFor != nil {
		s, err := p.opts.ReplayFor(r.Context(), sandbox)
		if err != nil {
			// Asking the model is always safe; a replay the setting forbids
			// is not.
			p.log.Warn("llm replay setting unreadable; asking the model", "sandbox", sandbox, "err", err)
			setting = ReplayOff
		} else if setting, err = ParseReplay(string(s)); err != nil {
			setting = ReplayOff
		}
	}
	var req Replay
	switch h := r.Header.Get(ReplayHeader); h {
	case "", string(ReplayAuto):
		req = ReplayAuto
	case string(ReplayOff):
		req = ReplayOff
	case "replay":
		req = ReplayAlways
	default:
		return "", fmt.Errorf("header %s: %q, want off, auto or replay: %w", ReplayHeader, h, errdefs.ErrInvalid)
	}
	if setting == ReplayOff {
		return ReplayOff, nil
	}
	return req, nil
}

// reruns keeps, per sandbox, the conversations a re-run may still be
// answered for: the exchanges a restore brought back (armed by Reset),
// each taken at most once, all dropped by the first call of the sandbox
// that goes to the model. An exchange recorded live is never armed, so a
// live agent's repeated call (a retry, best-of-n sampling) reaches the
// model every time.
type reruns struct {
	mu sync.Mutex
	m  map[string]map[delta.ID]struct{}
}

// arm makes convs the conversations sandbox's re-run may be answered for,
// replacing any earlier set.
func (r *reruns) arm(sandbox string, convs []delta.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]map[delta.ID]struct{}{}
	}
	if len(convs) == 0 {
		delete(r.m, sandbox)
		return
	}
	s := make(map[delta.ID]struct{}, len(convs))
	for _, c := range convs {
		s[c] = struct{}{}
	}
	r.m[sandbox] = s
}

// Rerunning says that sandbox is being re-run after a restore: some
// restored exchange may still answer one of its calls.
func (r *reruns) Rerunning(sandbox string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m[sandbox]) > 0
}

// TakeRerun says whether the re-run may be answered for conv, and if so
// uses that up: an exchange answers one call per restore.
func (r *reruns) TakeRerun(sandbox string, conv delta.ID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.m[sandbox]
	if _, ok := s[conv]; !ok {
		return false
	}
	delete(s, conv)
	if len(s) == 0 {
		delete(r.m, sandbox)
	}
	return true
}

// Live ends sandbox's re-run: one of its calls went to the model (the
// re-run diverged from the recorded one, or caught up with the restored
// state), so its timeline is live again.
func (r *reruns) Live(sandbox string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, sandbox)
}

// answer is the journal's side of one model call in the slow path (its
// conversation read first): the entry to replay, or nil when the call goes
// to the model, which then ends the sandbox's re-run.
func (p *Proxy) answer(ctx context.Context, x *exchange, mode Replay) *Entry {
	j := p.opts.Journal
	switch mode {
	case ReplayAuto:
		if !j.TakeRerun(x.sandbox, x.req.Conv) {
			j.Live(x.sandbox)
			return nil
		}
	case ReplayOff:
		j.Live(x.sandbox)
		return nil
	}
	e, err := j.Get(ctx, x.sandbox, x.req.Conv)
	if err != nil {
		p.m.journalErrs.WithLabelValues("get").Inc()
		p.log.Warn("llm journal read failed; asking the model", "sandbox", x.sandbox, "conv", x.req.Conv.Short(), "err", err)
		e = nil
	}
	if e == nil || e.Stream != x.req.Stream || e.Shape != x.req.Shape {
		j.Live(x.sandbox)
		return nil
	}
	return e
}
