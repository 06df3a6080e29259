package engine

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/roottest"
	"github.com/turnsnap/turnsnap/internal/testenv"
	"github.com/turnsnap/turnsnap/upload"
)

// These tests need root and overlayfs: they mount real sandboxes.

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// openEngine opens an engine on home and, at cleanup, removes every sandbox
// (unmounting it) so the temp dir can be deleted.
//
// Unless the test says its store is hostile, the final oracle is the
// store-only verify: whatever the test did, every record in the store must
// verify from the store alone with the rules a restore applies.
func openEngine(t testing.TB, home string) *Engine { return openEngineOracle(t, home, true) }

func openEngineOracle(t testing.TB, home string, oracle bool) *Engine {
	t.Helper()
	testenv.RequireRoot(t)
	e, err := Open(context.Background(), Options{Home: home})
	must(t, err)
	t.Cleanup(func() {
		// With a bucket shared by several hosts, records in it may name packs
		// this host never had: the catalog-based checkAll is the oracle there.
		if e.cat != nil && e.stores.remote == nil && oracle && !t.Failed() {
			if _, err := e.Verifier().VerifyStore(context.Background(), mustRef("")); err != nil {
				t.Errorf("final oracle: store-only verify of %s: %v", home, err)
			}
		}
		// And the catalog's oracle, in every test that opens an engine
		// here: every reference count, queue entry and pin as a rebuild
		// would make them, every object the catalog names present.
		if e.cat != nil && oracle && !t.Failed() {
			if err := e.Verifier().Checker().All(context.Background(), e.cat); err != nil {
				t.Errorf("final oracle: checker of %s: %v", home, err)
			}
		}
		if e.cat != nil {
			sbs, _ := e.ListSandboxes(context.Background())
			for _, s := range sbs {
				e.RemoveSandbox(context.Background(), s.Sandbox.Name)
			}
		}
		e.Close()
	})
	return e
}

func newEngine(t testing.TB) *Engine { return openEngine(t, filepath.Join(t.TempDir(), "home")) }

// The conformance suite's fixtures serve the engine's tests too: one rich
// base and one agent turn that exercise every entry kind.
func write(t testing.TB, p, content string) { roottest.Write(t, p, content) }

func richBase(t testing.TB) string { return roottest.RichBase(t) }

func agentTurn(t testing.TB, root string) { roottest.AgentTurn(t, root) }

// mergedState hashes everything a process in the sandbox sees (the
// conformance suite's oracle): equal hashes, same filesystem.
func mergedState(t testing.TB, root string) delta.ID { return roottest.Merged(t, root) }

// settle waits out the racy window so the next scan may trust its cache.
func settle() { roottest.Settle() }

func countObjects(t testing.TB, s upload.Store) int {
	t.Helper()
	n := 0
	must(t, s.List(context.Background(), "", func(upload.ObjectInfo) error { n++; return nil }))
	return n
}

// checkAll is the engine tests' final oracle: every checkpoint in the
// catalog verifies, and the refcounts equal a recount.
func checkAll(t testing.TB, e *Engine) {
	t.Helper()
	if err := e.Verifier().Checker().All(context.Background(), e.cat); err != nil {
		t.Fatalf("checker: %v", err)
	}
}

// smallSandbox creates sandbox name in e over a base of one file, a.txt.
func smallSandbox(t testing.TB, e *Engine, name string) *CreateResult {
	t.Helper()
	base := t.TempDir()
	write(t, filepath.Join(base, "a.txt"), "base\n")
	cr, err := e.CreateSandbox(context.Background(), delta.SandboxName(name), CreateOptions{Base: base})
	must(t, err)
	return cr
}
