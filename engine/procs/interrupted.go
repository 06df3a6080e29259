package procs

import (
	"fmt"
	"strings"

	"github.com/turnsnap/turnsnap/delta"
)

// Interrupted says what an interrupted operation left on a sandbox, for
// commands that report it rather than finish it (ps, diff, status).
type Interrupted struct {
	// Rollback is the checkpoint an interrupted rollback was moving to:
	// the root may be partly rewritten, the head is still the old one.
	Rollback *delta.ID `json:"rollback,omitempty"`
	// ProcessesLost says why a finished rollback's processes were not
	// restored (the checkpoint's processes do not run).
	ProcessesLost string `json:"processes_lost,omitempty"`
}

// Describe is the one line a command prints about it on sandbox name.
func (i *Interrupted) Describe(name string) string {
	if i == nil {
		return ""
	}
	var parts []string
	if i.Rollback != nil {
		parts = append(parts, fmt.Sprintf("an interrupted rollback to %s is pending: the root may be partly rewritten "+
			"(the next command that changes the sandbox finishes it; `turnsnap rollback %s --abandon` discards it)", i.Rollback.Short(), name))
	}
	if i.ProcessesLost != "" {
		parts = append(parts, "processes not restored: "+i.ProcessesLost)
	}
	return strings.Join(parts, "; ")
}
