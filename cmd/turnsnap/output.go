package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// usageErr recognises cobra's own argument and flag errors, which carry no
// error class of ours.
func usageErr(err error) bool {
	s := err.Error()
	for _, p := range []string{"accepts ", "requires ", "unknown flag", "unknown command", "unknown shorthand", "invalid argument", "flag needs an argument"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func bytesStr(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }

// durStr prints durations at a precision a person reads at a glance.
func durStr(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	default:
		return d.Round(10 * time.Millisecond).String()
	}
}

// parseBytes reads sizes such as "20MiB", "1.5GB", "1048576".
func parseBytes(s string) (int64, error) {
	n, err := humanize.ParseBytes(s)
	if err != nil || n > 1<<62 {
		return 0, fmt.Errorf("size %q: %v: %w", s, err, errdefs.ErrInvalid)
	}
	return int64(n), nil
}
