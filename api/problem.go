package api

// Problem is an RFC 9457 problem detail (application/problem+json). Class
// carries the errdefs class of the error, which the client maps back to
// the same errdefs error (Err), so the CLI exits with the same code through
// the daemon as without it.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Class  string `json:"class"`
	// ExitCode is a shell's code for a command that cannot run in the
	// sandbox (127 not found, 126 not executable), so the CLI exits the
	// same through the daemon as directly.
	ExitCode int `json:"exit_code,omitempty"`
	// Receipt is a restore_incomplete restore's receipt (engine.Receipt):
	// what differs, and what matched.
	Receipt *Receipt `json:"receipt,omitempty"`
	// State is what a restore_incomplete restore left the sandbox as.
	State string `json:"state,omitempty"`
	// Err is the error of Class (an errdefs error), which Unwrap returns:
	// whoever decodes a problem sets it (the client does), since this
	// package names no errors of turnsnap's. Not on the wire.
	Err error `json:"-"`
}

// Error makes a problem an error again; the message is the server's own.
func (p *Problem) Error() string { return p.Detail }

// Unwrap is the problem's class as an error (Err), so that errors.Is(err,
// errdefs.ErrNotFound) holds for a not_found problem the client decoded.
func (p *Problem) Unwrap() error { return p.Err }

// ProblemType prefixes a problem's type URI; the class completes it.
const ProblemType = "https://turnsnap.dev/problems/"

// ExecFrame is one NDJSON line of an exec's output stream: output
// (Stream stdout or stderr, Data the bytes, base64 in JSON), then exactly
// one last frame with ExitCode set or Error.
type ExecFrame struct {
	Stream   string   `json:"stream,omitempty"`
	Data     []byte   `json:"data,omitempty"`
	ExitCode *int     `json:"exit_code,omitempty"`
	Error    *Problem `json:"error,omitempty"`
}
