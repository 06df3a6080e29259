package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Every errdefs class has its own code, and the message keeps the error's
// text (which names the sandbox or checkpoint).
func TestStatusOfClasses(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{errdefs.ErrInvalid, codes.InvalidArgument},
		{errdefs.ErrNotFound, codes.NotFound},
		{errdefs.ErrExists, codes.AlreadyExists},
		{errdefs.ErrPrecondition, codes.FailedPrecondition},
		{errdefs.ErrUnavailable, codes.Unavailable},
		{errdefs.ErrKey, codes.PermissionDenied},
		{errdefs.ErrCorrupt, codes.DataLoss},
		{errdefs.ErrNoSpace, codes.ResourceExhausted},
		{errdefs.ErrRestoreIncomplete, codes.Internal},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{fmt.Errorf("plain"), codes.Internal},
	} {
		err := statusOf(fmt.Errorf("sandbox s7: %w", tc.err))
		st, _ := status.FromError(err)
		if st.Code() != tc.want || !strings.Contains(st.Message(), "sandbox s7") {
			t.Errorf("%v: %v %q, want %v", tc.err, st.Code(), st.Message(), tc.want)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600)
	for _, tc := range []struct {
		addr, token string
		unix, tcp   string
		bad         string
	}{
		{addr: "unix:/run/x.sock", unix: "/run/x.sock"},
		{addr: "/run/x.sock", unix: "/run/x.sock"},
		{addr: "unix:x.sock", bad: "absolute"},
		{addr: "unix:/" + strings.Repeat("a", 120), bad: "longer"},
		{addr: "127.0.0.1:9", token: tok, tcp: "127.0.0.1:9"},
		{addr: "[::1]:9", token: tok, tcp: "[::1]:9"},
		{addr: "127.0.0.1:9", bad: "bearer token"},
		{addr: "10.0.0.1:9", token: tok, bad: "loopback only"},
		{addr: ":9", token: tok, bad: "loopback only"},
		{addr: "nonsense", bad: "HOST:PORT"},
		{addr: "127.0.0.1:9", token: filepath.Join(dir, "missing"), bad: "token file"},
	} {
		ep, err := ParseEndpoint(tc.addr, tc.token)
		switch {
		case tc.bad != "":
			if err == nil || !strings.Contains(err.Error(), tc.bad) || errdefs.Class(err) != "invalid" {
				t.Errorf("%q: %v, want an invalid error naming %q", tc.addr, err, tc.bad)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.addr, err)
		case ep.Unix != tc.unix || ep.TCP != tc.tcp || (tc.tcp != "") != (ep.token != nil):
			t.Errorf("%q: %+v", tc.addr, ep)
		}
	}
}
