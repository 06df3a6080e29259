package docscheck

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/turnsnap/turnsnap/"

// Left out of the document's list on purpose: imported nearly everywhere.
var leaves = []string{"internal/errdefs", "internal/fsat"}

// TestArchitectureImportsAreTrue: every line "pkg -> a, b" of the import
// block in docs/ARCHITECTURE.md names exactly the module's packages that
// pkg's non-test files import (leaves aside), and every package outside
// internal/ with such imports has its line.
func TestArchitectureImportsAreTrue(t *testing.T) {
	doc := readImportBlock(t, filepath.Join("..", "..", "docs", "ARCHITECTURE.md"))
	real := moduleImports(t)
	for pkg, claimed := range doc {
		got, ok := real[pkg]
		if !ok {
			t.Errorf("ARCHITECTURE.md lists %s, which is not a package of the module", pkg)
			continue
		}
		if !slices.Equal(claimed, got) {
			t.Errorf("ARCHITECTURE.md: %s -> %s\n  but it imports: %s", pkg, strings.Join(claimed, ", "), strings.Join(got, ", "))
		}
	}
	for pkg, got := range real {
		if _, ok := doc[pkg]; !ok && len(got) > 0 && !strings.HasPrefix(pkg, "internal/") {
			t.Errorf("ARCHITECTURE.md has no line for %s (imports %s)", pkg, strings.Join(got, ", "))
		}
	}
}

// readImportBlock parses the fenced block under "## Import direction":
// "pkg -> a, b (why), c" lines, continued on indented lines; a line may
// name several packages with the same imports ("overlay, btrfs -> ...").
func readImportBlock(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	group := map[string][]string{} // the first name of a line: every name on it
	sc := bufio.NewScanner(f)
	state, cur := 0, ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case state == 0 && strings.HasPrefix(line, "## Import direction"):
			state = 1
		case state == 1 && strings.HasPrefix(line, "```"):
			state = 2
		case state == 2 && strings.HasPrefix(line, "```"):
			state = 3
		case state == 2:
			rest := line
			var names []string
			if lhs, rhs, ok := strings.Cut(line, "->"); ok && !strings.HasPrefix(line, " ") {
				for _, n := range strings.Split(lhs, ",") {
					names = append(names, strings.TrimSpace(n))
				}
				cur, rest = names[0], rhs
				for _, n := range names {
					out[n] = nil
				}
				group[cur] = names
			}
			if cur == "" {
				t.Fatalf("%s: import block line %q before any package", path, line)
			}
			rest = strings.TrimSpace(rest)
			if rest == "" || strings.HasPrefix(rest, "(") { // "(the standard library only)"
				continue
			}
			for _, p := range strings.Split(rest, ",") {
				// "btrfs (its Options)": the parenthesis says why.
				if i := strings.IndexByte(p, '('); i >= 0 {
					p = p[:i]
				}
				if p = strings.TrimSpace(p); p != "" {
					for _, n := range group[cur] {
						out[n] = append(out[n], p)
					}
				}
			}
		}
	}
	if state != 3 {
		t.Fatalf("%s: no fenced import block under \"## Import direction\"", path)
	}
	for k := range out {
		sort.Strings(out[k])
	}
	return out
}

// moduleImports lists, per package of the module (path relative to the
// module), the module's packages its non-test files import.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("SKIPPED: no go command on PATH to list the packages: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-json", "./...")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	dec := json.NewDecoder(stdout)
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.ImportPath, module)
		var deps []string
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(leaves, rel) {
				deps = append(deps, rel)
			}
		}
		sort.Strings(deps)
		out[name] = deps
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	return out
}
