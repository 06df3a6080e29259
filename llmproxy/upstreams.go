package llmproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/internal/fsat"
)

// UpstreamsFile is the home's file of per-sandbox LLM upstreams.
const UpstreamsFile = "llm-upstreams.json"

// maxUpstreamsFile bounds the file's read: a URL per sandbox is a few
// hundred bytes, so 1 MiB is thousands of sandboxes.
const maxUpstreamsFile = 1 << 20

// upstreamsDoc is the file's JSON.
type upstreamsDoc struct {
	Version   int               `json:"version"`
	Upstreams map[string]string `json:"upstreams"`
	// Replay holds the sandboxes whose journal never answers a call
	// ("off"); omitted when none is set, so such a file reads as before.
	Replay map[string]string `json:"replay,omitempty"`
}

// Upstreams is the home's sandbox → upstream base URL table
// (HOME/llm-upstreams.json): read bounded, written atomically (temp file,
// fsync, rename, fsync of the directory). Safe for concurrent use within one
// process; the daemon is the one writer while it serves the home.
type Upstreams struct {
	path string
	mu   sync.Mutex
}

// NewUpstreams is the table of the home at home.
func NewUpstreams(home string) *Upstreams {
	return &Upstreams{path: filepath.Join(home, UpstreamsFile)}
}

// CheckUpstream validates an upstream base URL: http or https, a host, no
// credentials (they would sit in a file and in logs; the agent's own
// Authorization header passes through instead), no query or fragment.
func CheckUpstream(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return invalidf("llm upstream: not a URL")
	case u.User != nil:
		return invalidf("llm upstream %s: a URL with credentials (user:pass@) is refused; the agent's own API key header passes through the proxy", RedactURL(raw))
	case u.Scheme != "http" && u.Scheme != "https":
		return invalidf("llm upstream %s: want an http or https URL", RedactURL(raw))
	case u.Host == "":
		return invalidf("llm upstream %s: no host", RedactURL(raw))
	case u.RawQuery != "" || u.Fragment != "":
		return invalidf("llm upstream %s: a base URL has no query or fragment", RedactURL(raw))
	}
	return nil
}

// RedactURL is raw as logs may show it: no credentials, no query.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	if u.RawQuery != "" {
		u.RawQuery = "REDACTED"
	}
	u.Fragment = ""
	return u.String()
}

func (u *Upstreams) read() (*upstreamsDoc, error) {
	f, err := os.Open(u.path)
	if os.IsNotExist(err) {
		return &upstreamsDoc{Version: 1, Upstreams: map[string]string{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("llm upstreams: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxUpstreamsFile+1))
	if err != nil {
		return nil, fmt.Errorf("llm upstreams %s: %w", u.path, err)
	}
	if len(data) > maxUpstreamsFile {
		return nil, fmt.Errorf("llm upstreams %s: over %d bytes: %w", u.path, maxUpstreamsFile, errdefs.ErrCorrupt)
	}
	var doc upstreamsDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil || doc.Version != 1 {
		return nil, fmt.Errorf("llm upstreams %s: not a version 1 upstreams file (%v): %w", u.path, err, errdefs.ErrCorrupt)
	}
	for name, raw := range doc.Upstreams {
		if !delta.ValidRefName(name) || CheckUpstream(raw) != nil {
			return nil, fmt.Errorf("llm upstreams %s: entry %q is not a sandbox and an upstream URL: %w", u.path, name, errdefs.ErrCorrupt)
		}
	}
	for name, r := range doc.Replay {
		if !delta.ValidRefName(name) || r != string(ReplayOff) {
			return nil, fmt.Errorf("llm upstreams %s: replay entry %q is not a sandbox set to off: %w", u.path, name, errdefs.ErrCorrupt)
		}
	}
	if doc.Upstreams == nil {
		doc.Upstreams = map[string]string{}
	}
	return &doc, nil
}

// Get returns sandbox's upstream, "" for the default.
func (u *Upstreams) Get(sandbox string) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	doc, err := u.read()
	if err != nil {
		return "", err
	}
	return doc.Upstreams[sandbox], nil
}

// Replay returns sandbox's replay setting (docs/LLM-PROXY.md, "When the
// journal answers"): off, or auto when none is set.
func (u *Upstreams) Replay(sandbox string) (Replay, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	doc, err := u.read()
	if err != nil {
		return "", err
	}
	if doc.Replay[sandbox] == string(ReplayOff) {
		return ReplayOff, nil
	}
	return ReplayAuto, nil
}

// All returns the table.
func (u *Upstreams) All() (map[string]string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	doc, err := u.read()
	if err != nil {
		return nil, err
	}
	return doc.Upstreams, nil
}

// Settings returns the table and the replay settings (sandbox → "off").
func (u *Upstreams) Settings() (upstreams, replay map[string]string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	doc, err := u.read()
	if err != nil {
		return nil, nil, err
	}
	return doc.Upstreams, doc.Replay, nil
}

// Set makes raw sandbox's upstream ("" clears it, the default applies).
func (u *Upstreams) Set(sandbox, raw string) error {
	if !delta.ValidRefName(sandbox) {
		return invalidf("sandbox name %q", sandbox)
	}
	if raw != "" {
		if err := CheckUpstream(raw); err != nil {
			return fmt.Errorf("sandbox %s: %w", sandbox, err)
		}
	}
	return u.update(func(doc *upstreamsDoc) {
		if raw == "" {
			delete(doc.Upstreams, sandbox)
		} else {
			doc.Upstreams[sandbox] = raw
		}
	})
}

// SetReplay sets sandbox's replay setting (auto clears it).
func (u *Upstreams) SetReplay(sandbox string, r Replay) error {
	if !delta.ValidRefName(sandbox) {
		return invalidf("sandbox name %q", sandbox)
	}
	return u.update(func(doc *upstreamsDoc) {
		if r == ReplayOff {
			if doc.Replay == nil {
				doc.Replay = map[string]string{}
			}
			doc.Replay[sandbox] = string(r)
		} else {
			delete(doc.Replay, sandbox)
		}
	})
}

// update rewrites the table with change applied.
func (u *Upstreams) update(change func(*upstreamsDoc)) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	doc, err := u.read()
	if err != nil {
		return err
	}
	change(doc)
	if len(doc.Replay) == 0 {
		doc.Replay = nil
	}
	data, err := json.MarshalIndent(upstreamsDoc{Version: 1, Upstreams: doc.Upstreams, Replay: doc.Replay}, "", "  ")
	if err != nil {
		return err
	}
	if len(data) > maxUpstreamsFile {
		return fmt.Errorf("llm upstreams: the table would exceed %d bytes: %w", maxUpstreamsFile, errdefs.ErrNoSpace)
	}
	if err := fsat.WriteFileDurable(u.path, string(data)+"\n"); err != nil {
		return fmt.Errorf("llm upstreams %s: %w", u.path, err)
	}
	return nil
}

// invalidf is an ErrInvalid error with a message.
func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}
