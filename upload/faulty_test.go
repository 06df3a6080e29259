package upload_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

func TestFaultyConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) upload.Store {
		return upload.NewFaulty(newLocal(t, t.TempDir()), upload.FaultPlan{})
	})
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("%s: got error %v, want ErrUnavailable", what, err)
	}
}

func TestFaultyFailsNthCall(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	f := upload.NewFaulty(newLocal(t, dir), upload.FaultPlan{Fail: map[upload.Op][]int{
		upload.OpPut:    {2},
		upload.OpGet:    {1},
		upload.OpStat:   {1},
		upload.OpList:   {1},
		upload.OpDelete: {1},
	}})
	if err := upload.PutBytes(ctx, f, "one", []byte("1")); err != nil {
		t.Fatalf("Put #1: %v", err)
	}
	wantUnavailable(t, "Put #2", upload.PutBytes(ctx, f, "two", []byte("2")))
	if err := upload.PutBytes(ctx, f, "three", []byte("3")); err != nil {
		t.Fatalf("Put #3: %v", err)
	}

	_, err := f.Get(ctx, "one")
	wantUnavailable(t, "Get #1", err)
	_, err = f.Stat(ctx, "one")
	wantUnavailable(t, "Stat #1", err)
	wantUnavailable(t, "List #1", f.List(ctx, "", func(upload.ObjectInfo) error { return nil }))
	wantUnavailable(t, "Delete #1", f.Delete(ctx, "one"))

	// Later calls reach the store, which never saw the failed Put and
	// still holds what the failed Delete was to remove.
	if _, err := f.Stat(ctx, "two"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat of the failed Put's object: got error %v, want ErrNotFound", err)
	}
	if b, err := upload.ReadAll(ctx, f, "one"); err != nil || string(b) != "1" {
		t.Errorf("Get after failed Delete = %q, %v; want the object", b, err)
	}
	want := map[upload.Op]int{upload.OpPut: 3, upload.OpGet: 2, upload.OpStat: 2, upload.OpList: 1, upload.OpDelete: 1}
	for op, n := range want {
		if got := f.Calls(op); got != n {
			t.Errorf("Calls(%s) = %d, want %d", op, got, n)
		}
	}
	wantNoTemp(t, dir)
}

// TestFaultyHalfPut checks that an upload cut off midway surfaces as an
// error and leaves no object, or the old one, and no temporary file.
func TestFaultyHalfPut(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	f := upload.NewFaulty(newLocal(t, dir), upload.FaultPlan{HalfPut: []int{1, 3, 4}})
	data := bytes.Repeat([]byte("0123456789"), 300_000)

	wantUnavailable(t, "half Put #1", upload.PutBytes(ctx, f, "new", data))
	if _, err := f.Stat(ctx, "new"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after half Put: got error %v, want ErrNotFound", err)
	}

	if err := upload.PutBytes(ctx, f, "old", []byte("old version")); err != nil {
		t.Fatalf("Put #2: %v", err)
	}
	wantUnavailable(t, "half Put #3", upload.PutBytes(ctx, f, "old", data))
	if b, err := upload.ReadAll(ctx, f, "old"); err != nil || string(b) != "old version" {
		t.Errorf("after a half overwrite, Get = %d bytes, %v; want the old version", len(b), err)
	}

	wantUnavailable(t, "half Put #4 of an empty object", upload.PutBytes(ctx, f, "empty", nil))
	if _, err := f.Stat(ctx, "empty"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after half Put of an empty object: got error %v, want ErrNotFound", err)
	}
	wantNoTemp(t, dir)
}

func TestFaultyKeepsRangeGetter(t *testing.T) {
	f := upload.NewFaulty(newLocal(t, t.TempDir()), upload.FaultPlan{Fail: map[upload.Op][]int{upload.OpGet: {2}}})
	if err := upload.PutBytes(t.Context(), f, "obj", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	rc, err := upload.GetRange(t.Context(), f, "obj", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	_, err = upload.GetRange(t.Context(), f, "obj", 2, 3)
	wantUnavailable(t, "GetRange as Get #2", err)
}

// TestFaultyPlanIsCopied checks that changing a plan after NewFaulty has no
// effect, so a test cannot race with the store it configured.
func TestFaultyPlanIsCopied(t *testing.T) {
	plan := upload.FaultPlan{Fail: map[upload.Op][]int{upload.OpPut: {1}}}
	f := upload.NewFaulty(newLocal(t, t.TempDir()), plan)
	plan.Fail[upload.OpPut][0] = 2
	wantUnavailable(t, "Put #1", upload.PutBytes(t.Context(), f, "x", nil))
	if err := upload.PutBytes(t.Context(), f, "x", nil); err != nil {
		t.Errorf("Put #2: %v", err)
	}
}
