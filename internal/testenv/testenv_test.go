package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// childEnv makes the test binary run TestMissingChild for real, as a child.
const childEnv = "TURNSNAP_TESTENV_CHILD"

// TestMissingChild is the child's test: it reports a missing part.
func TestMissingChild(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("run by TestMissing as a child")
	}
	Missing(t, "widget", "the test needs one")
	t.Log("REACHED: Missing returned") // Missing must stop the test either way
}

// Missing skips outside `make test` and fails under it: the guarantee that
// CI never passes by skipping. It is observed in a child test binary, since
// a failed test cannot be observed from inside.
func TestMissing(t *testing.T) {
	for _, requireAll := range []string{"", "1"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=1", RequireAllEnv+"="+requireAll)
		out, err := cmd.CombinedOutput()
		s := string(out)
		if strings.Contains(s, "REACHED") {
			t.Errorf("%s=%q: Missing let the test go on:\n%s", RequireAllEnv, requireAll, s)
		}
		if requireAll == "1" {
			if err == nil || !strings.Contains(s, "--- FAIL: TestMissingChild") || !strings.Contains(s, "widget is missing") {
				t.Errorf("%s=1: the test did not fail naming the part (%v):\n%s", RequireAllEnv, err, s)
			}
			continue
		}
		if err != nil || !strings.Contains(s, "--- SKIP: TestMissingChild") || !strings.Contains(s, "SKIPPED: widget is missing") {
			t.Errorf("%s unset: the test was not skipped loudly (%v):\n%s", RequireAllEnv, err, s)
		}
	}
}

// RequireRoot passes as root and is Missing otherwise.
func TestRequireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: RequireRoot would stop this test, which is what it is for")
	}
	RequireRoot(t) // returns as root
}
