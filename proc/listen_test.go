package proc

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// A listener opened with Listen answers a command inside the container on
// its loopback, the sandbox's way in to a service of the host.
func TestListenInContainerLoopback(t *testing.T) {
	rt := newRuntime(t)
	ctx := testCtx(t)
	id := startKeeper(t, rt, busyboxRootfs(t))
	if _, err := rt.Listen(id, "0.0.0.0:0"); err == nil {
		t.Fatal("Listen on a non-loopback address was accepted")
	}
	l, err := rt.Listen(id, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from the host\n")) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	addr := l.Addr().String()
	var out bytes.Buffer
	if code, err := rt.Exec(ctx, id, []string{"wget", "-qO-", "http://" + addr + "/"}, nil, &out, &out); err != nil || code != 0 {
		t.Fatalf("wget inside: %d %v: %s", code, err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "from the host") {
		t.Fatalf("inside the container the listener answered %q", got)
	}
}
