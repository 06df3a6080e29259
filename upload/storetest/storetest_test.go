package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/storetest"
)

func newLocal(t *testing.T) upload.Store {
	s, err := upload.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The suite passes on the reference store, upload's local one.
func TestSuiteOnLocal(t *testing.T) {
	storetest.Run(t, newLocal)
}

// unsortedList lists in reverse order; the contract says sorted.
type unsortedList struct{ upload.Store }

func (s unsortedList) List(ctx context.Context, prefix string, fn func(upload.ObjectInfo) error) error {
	var all []upload.ObjectInfo
	if err := s.Store.List(ctx, prefix, func(o upload.ObjectInfo) error { all = append(all, o); return nil }); err != nil {
		return err
	}
	for _, o := range slices.Backward(all) {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// keepsDeleted forgets to delete.
type keepsDeleted struct{ upload.Store }

func (keepsDeleted) Delete(context.Context, string) error { return nil }

// mutantEnv makes the test binary run the suite against a broken store,
// as a child: a failing suite cannot be observed from inside a test.
const mutantEnv = "TURNSNAP_STORETEST_MUTANT"

func TestMutantChild(t *testing.T) {
	switch os.Getenv(mutantEnv) {
	case "unsorted-list":
		storetest.Run(t, func(t *testing.T) upload.Store { return unsortedList{newLocal(t)} })
	case "keeps-deleted":
		storetest.Run(t, func(t *testing.T) upload.Store { return keepsDeleted{newLocal(t)} })
	default:
		t.Skip("run by TestSuiteCatchesBrokenStores as a child")
	}
}

// The suite fails stores that break the contract, in the subtest about
// the broken part.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	for mutant, subtest := range map[string]string{"unsorted-list": "List", "keeps-deleted": "Delete"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMutantChild$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), mutantEnv+"="+mutant)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--- FAIL: TestMutantChild/"+subtest+" ") {
			t.Errorf("a store that %s passed the suite's %s test (%v):\n%s", mutant, subtest, err, out)
		}
	}
}
