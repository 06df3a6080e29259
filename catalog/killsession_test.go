package catalog

import (
	"context"
	"fmt"
)

// sessionEnv makes the test binary run session on the catalog it names.
const sessionEnv = "TURNSNAP_CATALOG_TEST_SESSION"

// sessionBlobs is how many blobs each writable session commits.
const sessionBlobs = 2

// session is what TestKilledInsideBadger kills at every step: two writable
// sessions (each: open, commit blobs one per transaction, close), then a
// read-only one, so the kills land in Badger's open after a crash (replay
// and flush of the memtable) and after a clean close, in its commits, and in
// its close. It prints the number of each blob once its commit returned:
// those are the ones that must survive the kill.
func session(dir string) error {
	ctx := context.Background()
	for s := 0; s < 2; s++ {
		c, err := Open(ctx, dir, Options{})
		if err != nil {
			return err
		}
		for i := 100 + s*sessionBlobs; i < 100+(s+1)*sessionBlobs; i++ {
			if err := c.Update(ctx, func(tx *Tx) error { return tx.PutBlob(nthID(i), testBlobLocation()) }); err != nil {
				return err
			}
			fmt.Printf("%d\n", i)
		}
		if err := c.Close(); err != nil {
			return err
		}
	}
	c, err := Open(ctx, dir, Options{ReadOnly: true})
	if err != nil {
		return err
	}
	return c.Close()
}
