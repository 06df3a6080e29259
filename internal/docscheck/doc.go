// Package docscheck holds tests that keep the design documents true to
// the code: docs/ARCHITECTURE.md's import list is checked against what
// the packages import (go list), so a move that changes the layout fails
// `make test` until the document says so too.
package docscheck
