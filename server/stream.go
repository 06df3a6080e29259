package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
)

// Streams. An exec's output and the event stream are sent as NDJSON
// (application/x-ndjson, one JSON object a line) or, when the client's
// Accept names text/event-stream, as server-sent events. The SSE writer is
// the few lines below rather than a library: the libraries found
// (r3labs/sse, gin-contrib/sse, go-libsse) bring their own broadcast hubs
// and reconnect models, while what is needed here is one request's frames,
// flushed as written, with a bounded per-subscriber buffer (Monitor).

// frames writes one stream's frames.
type frames struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	sse  bool
	sent bool // headers are out
}

func wantsSSE(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

func (f *frames) start() {
	if f.sent {
		return
	}
	f.sent = true
	h := f.w.Header()
	if f.sse {
		h.Set("Content-Type", "text/event-stream")
	} else {
		h.Set("Content-Type", "application/x-ndjson")
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	f.w.WriteHeader(http.StatusOK)
}

// send writes one frame: for SSE an event named kind whose data is v, for
// NDJSON v itself (which names its kind).
func (f *frames) send(kind string, id string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.start()
	if f.sse {
		if id != "" {
			fmt.Fprintf(f.w, "id: %s\n", id)
		}
		_, err = fmt.Fprintf(f.w, "event: %s\ndata: %s\n\n", kind, data)
	} else {
		_, err = f.w.Write(append(data, '\n'))
	}
	if err != nil {
		return err
	}
	return http.NewResponseController(f.w).Flush()
}

// output is an io.Writer of one stream's frames.
type output struct {
	f    *frames
	name string
}

func (o output) Write(b []byte) (int, error) {
	fr := api.ExecFrame{Stream: o.name, Data: b}
	if o.f.sse {
		if err := o.f.send(o.name, "", api.ExecFrame{Data: b}); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	if err := o.f.send(o.name, "", fr); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, err := delta.ParseSandboxName(name); err != nil {
		writeProblem(w, err)
		return
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, s.maxBody))
	dec.DisallowUnknownFields()
	var req api.ExecRequest
	if err := dec.Decode(&req); err != nil {
		writeProblem(w, invalidf("exec request: %v", err))
		return
	}
	if req.StdinStream && len(req.Stdin) > 0 {
		writeProblem(w, invalidf("exec request: stdin and stdin_stream exclude each other"))
		return
	}
	var stdio api.Stdio
	switch {
	case req.StdinStream:
		// The rest of the body is the command's input, read while its
		// output is written.
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			writeProblem(w, err)
			return
		}
		stdio.In = io.MultiReader(dec.Buffered(), r.Body)
	case len(req.Stdin) > 0:
		stdio.In = strings.NewReader(string(req.Stdin))
	}
	if req.Detach {
		res, err := s.svc.Exec(r.Context(), name, req, api.Stdio{})
		if err != nil {
			s.mon.requestFailed(err)
			writeProblem(w, err)
			return
		}
		s.log.Info("detached process started", "sandbox", name, "pid", res.PID, "argv", req.Argv)
		writeJSON(w, http.StatusOK, res)
		return
	}
	f := &frames{w: w, sse: wantsSSE(r)}
	stdio.Out, stdio.Err = output{f, "stdout"}, output{f, "stderr"}
	res, err := s.svc.Exec(r.Context(), name, req, stdio)
	if err != nil {
		s.mon.requestFailed(err)
		f.mu.Lock()
		sent := f.sent
		f.mu.Unlock()
		if !sent {
			writeProblem(w, err)
			return
		}
		p := ProblemFor(err)
		if f.sse {
			f.send("error", "", p)
		} else {
			f.send("error", "", api.ExecFrame{Error: p})
		}
		return
	}
	code := res.ExitCode
	if f.sse {
		f.send("exit", "", map[string]int{"exit_code": code})
	} else {
		f.send("exit", "", api.ExecFrame{ExitCode: &code})
	}
}

// events streams events until the client goes away or the daemon stops.
// ?sandbox=NAME keeps one sandbox's. A client that reconnects sends the
// ID of the last event it got as Last-Event-ID (the SSE header; NDJSON
// clients send it too) and gets every event after it: from the monitor's
// ring, led by a gap event for those the ring no longer has. A reader too
// slow for its buffer is caught up the same way, from the ring, so a
// stream never skips an event without saying so.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	only := r.URL.Query().Get("sandbox")
	backlog, ch, cancel := s.mon.SubscribeAfter(r.Header.Get("Last-Event-ID"))
	defer cancel()
	f := &frames{w: w, sse: wantsSSE(r)}
	f.mu.Lock()
	f.start() // a subscriber knows it is subscribed once the headers come
	f.mu.Unlock()
	if err := http.NewResponseController(w).Flush(); err != nil {
		return
	}
	var last uint64 // the seq of the last event sent (gaps have none)
	send := func(ev api.Event) error {
		if ev.Type != api.EventGap {
			if ev.Seq <= last {
				return nil // sent from the ring already
			}
			last = ev.Seq
		}
		if only != "" && ev.Type != api.EventGap && ev.Sandbox != only {
			return nil
		}
		if err := f.send(ev.Type, ev.ID, ev); err != nil && !errors.Is(err, http.ErrHandlerTimeout) {
			return err
		}
		return nil
	}
	for _, ev := range backlog {
		if err := send(ev); err != nil {
			return
		}
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if last > 0 && ev.Seq > last+1 {
				// The buffer overflowed: what it dropped is in the ring.
				for _, m := range s.mon.since(last) {
					if err := send(m); err != nil {
						return
					}
				}
			}
			if err := send(ev); err != nil {
				return
			}
		}
	}
}
