package catalog

import (
	"testing"

	"github.com/turnsnap/turnsnap/delta"
)

func TestUploadQueueOrderAndPersistence(t *testing.T) {
	dir := t.TempDir()
	c := openAt(t, dir)
	cp := delta.Hash([]byte("cp"))
	update(t, c, func(tx *Tx) error {
		return tx.EnqueueUploads([]PendingUpload{
			{Sandbox: "s", Checkpoint: cp, Name: "packs/aa/1", Size: 10},
			{Sandbox: "s2", Checkpoint: cp, Name: "records/x", Size: 1},
			{Sandbox: "s", Checkpoint: cp, Name: "records/1", Size: 2},
			{Sandbox: "s", Checkpoint: cp, Name: "refs/heads/s", Size: 3},
		})
	})
	var got []PendingUpload
	view(t, c, func(tx *Tx) (err error) { got, err = tx.PendingUploads("s"); return err })
	if len(got) != 3 || got[0].Name != "packs/aa/1" || got[1].Name != "records/1" || got[2].Name != "refs/heads/s" {
		t.Fatalf("sandbox s queue: %+v (want commit order, and not s2's entry)", got)
	}
	update(t, c, func(tx *Tx) error { return tx.UploadDone(got[0]) })
	c.Close()
	c = openAt(t, dir)
	var all []PendingUpload
	view(t, c, func(tx *Tx) (err error) { all, err = tx.PendingUploads(""); return err })
	if len(all) != 3 || all[0].Name != "records/1" || all[2].Sandbox != "s2" {
		t.Fatalf("queue after reopen: %+v", all)
	}
	// Sequence numbers keep growing across transactions.
	update(t, c, func(tx *Tx) error {
		return tx.EnqueueUploads([]PendingUpload{{Sandbox: "s", Checkpoint: cp, Name: "packs/bb/2"}})
	})
	view(t, c, func(tx *Tx) (err error) { got, err = tx.PendingUploads("s"); return err })
	if got[len(got)-1].Name != "packs/bb/2" || got[len(got)-1].Seq <= all[len(all)-1].Seq {
		t.Fatalf("new entry not last: %+v", got)
	}
	update(t, c, func(tx *Tx) error {
		if err := tx.EnqueueUploads([]PendingUpload{{Sandbox: "bad/name", Name: "x"}}); err == nil {
			t.Error("invalid sandbox name accepted")
		}
		return nil
	})
}

func TestDequeueNamesAcrossSandboxes(t *testing.T) {
	c := openTest(t)
	update(t, c, func(tx *Tx) error {
		return tx.EnqueueUploads([]PendingUpload{
			{Sandbox: "_backfill", Name: "records/a"}, {Sandbox: "s", Name: "records/a"},
			{Sandbox: "s", Name: "records/b"}, {Sandbox: "t", Name: "packs/x"},
		})
	})
	var n int
	update(t, c, func(tx *Tx) (err error) {
		n, err = tx.DequeueNames(map[string]bool{"records/a": true, "packs/x": true})
		return err
	})
	var left []PendingUpload
	update(t, c, func(tx *Tx) (err error) { left, err = tx.PendingUploads(""); return err })
	if n != 3 || len(left) != 1 || left[0].Name != "records/b" {
		t.Fatalf("dequeued %d, left %+v", n, left)
	}
}
