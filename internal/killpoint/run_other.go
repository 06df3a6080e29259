//go:build !(linux && amd64)

package killpoint

import (
	"context"
	"os"
)

// Run is implemented on linux/amd64 only (it reads amd64 registers).
func Run(ctx context.Context, argv, env []string, files []*os.File, dir string, kill func(call string) bool) ([]string, error) {
	return nil, ErrUnsupported
}
