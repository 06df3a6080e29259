package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	pb "github.com/turnsnap/turnsnap/kube/snapshot/v1alpha1"
)

// grpcAddr waits for the daemon's log line naming the snapshot provider's
// address.
func grpcAddr(t *testing.T, d *daemonProc) string {
	t.Helper()
	re := regexp.MustCompile(`KEP-0694\)" addr=(\S+)`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindStringSubmatch(d.stderr.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot provider address in the log:\n%s", d.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func driverClient(t *testing.T, target string) pb.SnapshotDriverClient {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewSnapshotDriverClient(conn)
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, want)
	}
}

// The EXPERIMENTAL KEP-0694 snapshot provider, on a real daemon over its
// real gRPC listener (loopback TCP with the daemon's bearer token, then a
// unix socket): Checkpoint returns the checkpoint the HTTP API sees;
// Restore into a new name branches, with a receipt whose state is the
// checkpoint's (and the files are there); Restore into the checkpoint's
// own sandbox rolls it back, with the same state in its receipt; Delete
// forgets an old checkpoint, refuses a head, and says NotFound after; a
// call without the token or with another is Unauthenticated; ids that
// are not full checkpoint ids are InvalidArgument.
func TestSnapshotProviderGRPC(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("base\n"), 0o644)
	tokenFile := filepath.Join(dir, "token")
	token := "kep-token-0123456789abcdef"
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)

	// Refused before the home is opened: non-loopback TCP, TCP without the
	// daemon's token, a relative socket path, with --tenants.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--snapshot-grpc", "0.0.0.0:0", "--listen", "127.0.0.1:0", "--token-file", tokenFile}, "loopback only"},
		{[]string{"--snapshot-grpc", "127.0.0.1:0"}, "bearer token"},
		{[]string{"--snapshot-grpc", "unix:rel.sock"}, "absolute"},
		{[]string{"--snapshot-grpc", "unix:" + filepath.Join(dir, "t.sock"), "--tenants", filepath.Join(dir, "tenants")}, "--tenants"},
	} {
		_, errs, code := cliRun(t, home, append([]string{"serve"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("serve %v: exit %d, %q; want exit 2 naming %q", tc.args, code, errs, tc.want)
		}
	}

	d := startDaemon(t, home, nil, "--listen", "127.0.0.1:0", "--token-file", tokenFile, "--snapshot-grpc", "127.0.0.1:0")
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := c.CreateSandbox(ctx, api.CreateRequest{Name: "src", Base: base})
	if err != nil {
		t.Fatal(err)
	}
	// Runs after the daemons stop (cleanups run last first), so directly
	// on the home.
	t.Cleanup(func() {
		for _, n := range []string{"src", "fork"} {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})
	before, err := c.Log(ctx, "src")
	if err != nil {
		t.Fatal(err)
	}
	drv := driverClient(t, grpcAddr(t, d))
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)

	// Unauthenticated: no token, a wrong one, the right one not as Bearer.
	for _, md := range [][]string{nil, {"authorization", "Bearer wrong-token-0123456789"}, {"authorization", token}} {
		cctx := ctx
		if md != nil {
			cctx = metadata.AppendToOutgoingContext(ctx, md...)
		}
		_, err := drv.Checkpoint(cctx, &pb.CheckpointRequest{SandboxName: "src"})
		wantCode(t, "checkpoint with metadata "+strings.Join(md, "="), err, codes.Unauthenticated)
	}
	if log, _ := c.Log(ctx, "src"); len(log) != len(before) {
		t.Fatalf("an unauthenticated call checkpointed: %v", log)
	}

	// Checkpoint: the id is the HTTP API's head.
	os.WriteFile(filepath.Join(created.Root, "f"), []byte("one\n"), 0o644)
	cp1, err := drv.Checkpoint(authed, &pb.CheckpointRequest{SandboxName: "src", SandboxNamespace: "ns", PodName: "pod", Message: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if cp1.Class != "fs" || cp1.SizeBytes <= 0 || cp1.RemoteDurable || cp1.DriverMetadata["class"] != "fs" || cp1.Turn != 1 {
		t.Errorf("checkpoint 1: %+v", cp1)
	}
	sb, err := c.GetCheckpoint(ctx, cp1.SnapshotUid)
	if err != nil || !sb.Head || string(sb.ID) != cp1.SnapshotUid || sb.Message != "one" {
		t.Fatalf("checkpoint 1 over HTTP: %+v %v", sb, err)
	}
	// A waitRemoteDurable parameter that is not a boolean is refused.
	if _, err := drv.Checkpoint(authed, &pb.CheckpointRequest{SandboxName: "src", Parameters: map[string]string{"waitRemoteDurable": "maybe"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("waitRemoteDurable=maybe: %v", err)
	}
	os.WriteFile(filepath.Join(created.Root, "f"), []byte("two\n"), 0o644)
	cp2, err := drv.Checkpoint(authed, &pb.CheckpointRequest{SandboxName: "src"})
	if err != nil {
		t.Fatal(err)
	}
	if cp2.ParentUid != cp1.SnapshotUid || cp2.SnapshotUid == cp1.SnapshotUid {
		t.Errorf("checkpoint 2: %+v, want parent %s", cp2, cp1.SnapshotUid)
	}
	// A turn that changed nothing names the head, whose state it is.
	skip, err := drv.Checkpoint(authed, &pb.CheckpointRequest{SandboxName: "src"})
	if err != nil || skip.Class != "skip" || skip.SnapshotUid != cp2.SnapshotUid || skip.SizeBytes != 0 {
		t.Errorf("skip turn: %+v %v", skip, err)
	}

	// Restore into a new sandbox: a branch of checkpoint 1.
	br, err := drv.Restore(authed, &pb.RestoreRequest{SandboxName: "fork", SnapshotUid: cp1.SnapshotUid})
	if err != nil {
		t.Fatal(err)
	}
	rc := br.Receipt
	if br.Mode != "branch" || rc == nil || !rc.Ok || !rc.FilesMatch || rc.WantState == "" || rc.GotState != rc.WantState ||
		rc.Kind != "branch" || rc.SnapshotUid != cp1.SnapshotUid || rc.SandboxName != "fork" {
		t.Fatalf("branch: %+v", br)
	}
	if b, _ := os.ReadFile(filepath.Join(br.Root, "f")); !bytes.Equal(b, []byte("one\n")) {
		t.Errorf("branch's f: %q", b)
	}

	// Restore into the checkpoint's own sandbox: a rollback, whose
	// receipt has the same state as the branch's.
	rb, err := drv.Restore(authed, &pb.RestoreRequest{SandboxName: "src", SnapshotUid: cp1.SnapshotUid})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Mode != "rollback" || rb.Receipt == nil || !rb.Receipt.Ok || rb.Receipt.Kind != "rollback" ||
		rb.Receipt.WantState != rc.WantState || rb.Receipt.GotState != rc.WantState {
		t.Fatalf("rollback: %+v, want state %s", rb, rc.WantState)
	}
	if b, _ := os.ReadFile(filepath.Join(created.Root, "f")); !bytes.Equal(b, []byte("one\n")) {
		t.Errorf("rolled back f: %q", b)
	}
	// Another existing sandbox is not overwritten.
	_, err = drv.Restore(authed, &pb.RestoreRequest{SandboxName: "fork", SnapshotUid: cp2.SnapshotUid})
	wantCode(t, "restore into another existing sandbox", err, codes.AlreadyExists)

	// Delete: checkpoint 1 is src's head now (and fork's branch point):
	// kept. Checkpoint 2 is neither: forgotten, then unknown.
	_, err = drv.Delete(authed, &pb.DeleteRequest{SnapshotUid: cp1.SnapshotUid})
	wantCode(t, "delete of a head", err, codes.FailedPrecondition)
	del, err := drv.Delete(authed, &pb.DeleteRequest{SnapshotUid: cp2.SnapshotUid})
	if err != nil || !del.Deleted {
		t.Fatalf("delete of checkpoint 2: %+v %v", del, err)
	}
	if _, err := c.GetCheckpoint(ctx, cp2.SnapshotUid); err == nil {
		t.Error("checkpoint 2 still resolves over HTTP after Delete")
	}
	_, err = drv.Delete(authed, &pb.DeleteRequest{SnapshotUid: cp2.SnapshotUid})
	wantCode(t, "delete again", err, codes.NotFound)
	_, err = drv.Restore(authed, &pb.RestoreRequest{SandboxName: "other", SnapshotUid: cp2.SnapshotUid})
	wantCode(t, "restore of a deleted checkpoint", err, codes.NotFound)
	if b, _ := os.ReadFile(filepath.Join(created.Root, "f")); !bytes.Equal(b, []byte("one\n")) {
		t.Errorf("src's f after the deletes: %q", b)
	}

	// Bad ids: prefixes, tags, HEAD forms, uppercase, junk, empty.
	for _, id := range []string{cp1.SnapshotUid[:12], "HEAD", "src@HEAD", strings.ToUpper(cp1.SnapshotUid), cp1.SnapshotUid + "~1", "../x", ""} {
		_, err := drv.Restore(authed, &pb.RestoreRequest{SandboxName: "x", SnapshotUid: id})
		wantCode(t, "restore of "+id, err, codes.InvalidArgument)
		_, err = drv.Delete(authed, &pb.DeleteRequest{SnapshotUid: id})
		wantCode(t, "delete of "+id, err, codes.InvalidArgument)
	}
	_, err = drv.Checkpoint(authed, &pb.CheckpointRequest{SandboxName: "no-such"})
	wantCode(t, "checkpoint of an unknown sandbox", err, codes.NotFound)
	_, err = drv.Checkpoint(authed, &pb.CheckpointRequest{SandboxName: "../bad"})
	wantCode(t, "checkpoint of a bad name", err, codes.InvalidArgument)
	_, err = drv.Restore(authed, &pb.RestoreRequest{SandboxName: "../bad", SnapshotUid: cp1.SnapshotUid})
	wantCode(t, "restore into a bad name", err, codes.InvalidArgument)
	d.stop(t)

	// The unix socket: mode 0600, no token needed (only root reaches it).
	sock := filepath.Join(dir, "kep.sock")
	d = startDaemon(t, home, nil, "--snapshot-grpc", "unix:"+sock)
	if got := grpcAddr(t, d); got != sock {
		t.Errorf("unix address %q, want %q", got, sock)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v %v", sock, fi, err)
	}
	os.WriteFile(filepath.Join(created.Root, "f"), []byte("three\n"), 0o644)
	cp3, err := driverClient(t, "unix://"+sock).Checkpoint(ctx, &pb.CheckpointRequest{SandboxName: "src"})
	if err != nil || cp3.Class != "fs" || cp3.ParentUid != cp1.SnapshotUid {
		t.Fatalf("checkpoint over the unix socket: %+v %v", cp3, err)
	}
}

// With a shared bucket (a real MinIO): the SnapshotClass parameter
// waitRemoteDurable makes Checkpoint return once the checkpoint is in the
// bucket (remote_durable), and Delete is two-phase: the record is marked,
// to be deleted after the grace (delete_after), and still restores
// meanwhile.
func TestSnapshotProviderGRPCRemote(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	home, base := filepath.Join(dir, "home"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "a"), []byte("a\n"), 0o644)
	mustCLI(t, home, "init", "--remote", "s3://kep/team", "--endpoint", srv.Endpoint, "--insecure")
	sock := filepath.Join(dir, "kep.sock")
	d := startDaemon(t, home, nil, "--snapshot-grpc", sock)
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := c.CreateSandbox(ctx, api.CreateRequest{Name: "s", Base: base})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range []string{"s", "again"} {
			cliRun(t, home, "sandbox", "rm", n)
		}
	})
	drv := driverClient(t, "unix://"+grpcAddr(t, d))
	os.WriteFile(filepath.Join(created.Root, "f"), []byte("one\n"), 0o644)
	cp1, err := drv.Checkpoint(ctx, &pb.CheckpointRequest{SandboxName: "s", Parameters: map[string]string{"waitRemoteDurable": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	if !cp1.RemoteDurable || cp1.DriverMetadata["remote_durable"] != "true" {
		t.Errorf("checkpoint with waitRemoteDurable: %+v", cp1)
	}
	os.WriteFile(filepath.Join(created.Root, "f"), []byte("two\n"), 0o644)
	if _, err := drv.Checkpoint(ctx, &pb.CheckpointRequest{SandboxName: "s", WaitRemoteDurable: true}); err != nil {
		t.Fatal(err)
	}
	del, err := drv.Delete(ctx, &pb.DeleteRequest{SnapshotUid: cp1.SnapshotUid})
	if err != nil {
		t.Fatal(err)
	}
	after, perr := time.Parse(time.RFC3339, del.DeleteAfter)
	if del.Deleted || !del.Marked || perr != nil || !after.After(time.Now()) {
		t.Fatalf("delete with a bucket: %+v (%v), want marked for later", del, perr)
	}
	// Marked, not gone: it still restores until a later run deletes it.
	br, err := drv.Restore(ctx, &pb.RestoreRequest{SandboxName: "again", SnapshotUid: cp1.SnapshotUid})
	if err != nil || !br.Receipt.GetOk() {
		t.Fatalf("restore of a marked checkpoint: %+v %v", br, err)
	}
	if b, _ := os.ReadFile(filepath.Join(br.Root, "f")); !bytes.Equal(b, []byte("one\n")) {
		t.Errorf("restored f: %q", b)
	}
}

// Fenced is FAILED_PRECONDITION: once another home adopted the sandbox,
// the first home's Checkpoint that waits for remote durability is refused
// (its head is fenced in the bucket). The adopting home owns the
// sandbox's checkpoints, and may Delete them.
func TestSnapshotProviderGRPCFenced(t *testing.T) {
	testenv.RequireRoot(t)
	srv := miniotest.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	dir := t.TempDir()
	homeA, homeB, base := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "base")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "f"), []byte("f\n"), 0o644)
	remoteArgs := []string{"init", "--remote", "s3://fenced/fleet", "--endpoint", srv.Endpoint, "--insecure"}
	mustCLI(t, homeA, remoteArgs...)
	mustCLI(t, homeB, remoteArgs...)
	mustCLI(t, homeA, "sandbox", "create", "s", "--base", base)
	t.Cleanup(func() {
		cliRun(t, homeA, "sandbox", "rm", "s")
		cliRun(t, homeB, "sandbox", "rm", "s")
	})
	root, _ := mustCLI(t, homeA, "sandbox", "path", "s")
	os.WriteFile(filepath.Join(strings.TrimSpace(root), "g"), []byte("g\n"), 0o644)
	out, _ := mustCLI(t, homeA, "checkpoint", "s", "--json")
	var cp struct{ ID string }
	if err := json.Unmarshal([]byte(out), &cp); err != nil || cp.ID == "" {
		t.Fatalf("checkpoint: %s %v", out, err)
	}
	os.WriteFile(filepath.Join(strings.TrimSpace(root), "g"), []byte("g2\n"), 0o644)
	mustCLI(t, homeA, "checkpoint", "s")
	mustCLI(t, homeA, "sync")
	mustCLI(t, homeB, "catalog", "rebuild")
	mustCLI(t, homeB, "sandbox", "adopt", "s")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sockA := filepath.Join(dir, "a.sock")
	dA := startDaemon(t, homeA, nil, "--snapshot-grpc", sockA)
	os.WriteFile(filepath.Join(strings.TrimSpace(root), "late"), []byte("late\n"), 0o644)
	_, err := driverClient(t, "unix://"+grpcAddr(t, dA)).Checkpoint(ctx,
		&pb.CheckpointRequest{SandboxName: "s", WaitRemoteDurable: true})
	wantCode(t, "home a's checkpoint after b adopted", err, codes.FailedPrecondition)
	dA.stop(t)

	// The adopting home owns the sandbox now, checkpoints before the
	// adoption included: its Delete is the two-phase one.
	sockB := filepath.Join(dir, "b.sock")
	dB := startDaemon(t, homeB, nil, "--snapshot-grpc", sockB)
	del, err := driverClient(t, "unix://"+grpcAddr(t, dB)).Delete(ctx, &pb.DeleteRequest{SnapshotUid: cp.ID})
	if err != nil || !del.Marked {
		t.Errorf("home b's delete of the adopted sandbox's checkpoint: %+v %v", del, err)
	}
}
