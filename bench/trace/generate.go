package trace

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"strings"
	"time"
)

// MaxGenPackages bounds one generator (about 20 files a package).
const MaxGenPackages = 5000

// Generator writes a generated tree into the base. The only kind is
// "vendor": Packages vendored dependencies under Dir, laid out like a
// node_modules tree (package.json, README.md, LICENSE, index.js, lib/,
// test/), 8 to 32 files each, about 20 on average and 1 KB a file. The
// same Seed and Packages always write the same bytes, names, modes and
// mtimes.
type Generator struct {
	Kind     string `json:"kind"`
	Dir      string `json:"dir"`
	Packages int    `json:"packages"`
	Seed     uint64 `json:"seed,omitempty"`
}

func checkGenerate(gs []Generator) error {
	if len(gs) > 8 {
		return errors.New("more than 8 generators")
	}
	for _, g := range gs {
		switch {
		case g.Kind != "vendor":
			return fmt.Errorf("kind %q, want vendor", g.Kind)
		case g.Packages < 1 || g.Packages > MaxGenPackages:
			return fmt.Errorf("%d packages, want 1 to %d", g.Packages, MaxGenPackages)
		}
		if err := checkPath(g.Dir); err != nil {
			return fmt.Errorf("dir %q: %v", g.Dir, err)
		}
	}
	return nil
}

var genWords = strings.Fields(`array async buffer cache chalk color config core date debug deep diff emit
	encode error event fast fetch file format glob graph hash http icon json lexer list lock log
	map merge mime minify ms node object parse path pipe pool promise proxy query queue range
	regex retry route schema semver shell signal sort split stream string style sync table text
	time token trim type url util uuid valid walk watch wrap yaml zip`)

// genTime is every generated entry's mtime.
var genTime = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// Write writes the tree under root and returns how many files it wrote.
func (g Generator) Write(root *os.Root) (int, error) {
	rng := rand.New(rand.NewPCG(g.Seed, uint64(g.Packages)))
	files := 0
	put := func(name, body string, mode os.FileMode) error {
		p := path.Join(g.Dir, name)
		if err := root.MkdirAll(path.Dir(p), 0o755); err != nil {
			return err
		}
		if err := root.WriteFile(p, []byte(body), mode); err != nil {
			return err
		}
		files++
		return root.Chtimes(p, genTime, genTime)
	}
	names := make([]string, g.Packages)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%s-%d", genWords[rng.IntN(len(genWords))], genWords[rng.IntN(len(genWords))], i)
	}
	for i, name := range names {
		version := fmt.Sprintf("%d.%d.%d", rng.IntN(5), rng.IntN(20), rng.IntN(40))
		var deps []string
		for k := rng.IntN(4); k > 0 && i > 0; k-- {
			d := names[rng.IntN(i)]
			deps = append(deps, fmt.Sprintf("    %q: \"^%d.0.0\"", d, rng.IntN(5)))
		}
		libs := 4 + rng.IntN(24)
		pkg := fmt.Sprintf("{\n  \"name\": %q,\n  \"version\": %q,\n  \"main\": \"index.js\",\n  \"license\": \"MIT\",\n  \"dependencies\": {\n%s\n  }\n}\n",
			name, version, strings.Join(deps, ",\n"))
		steps := []struct {
			name, body string
		}{
			{"package.json", pkg},
			{"README.md", fmt.Sprintf("# %s\n\nVersion %s. Generated for the turnsnap bench: a vendored dependency\nwith %d modules.\n", name, version, libs)},
			{"LICENSE", "MIT License\n\nGenerated test content for the turnsnap benchmark; no code of anyone's.\n"},
		}
		var index strings.Builder
		index.WriteString("'use strict';\n")
		for j := 0; j < libs; j++ {
			fmt.Fprintf(&index, "exports.m%d = require('./lib/m%d.js');\n", j, j)
			var b strings.Builder
			fmt.Fprintf(&b, "'use strict';\n// %s/lib/m%d.js\n", name, j)
			for f := 1 + rng.IntN(12); f > 0; f-- {
				w := genWords[rng.IntN(len(genWords))]
				fmt.Fprintf(&b, "function %s%d(x) {\n  return (x * %d + %d) %% %d;\n}\nmodule.exports.%s%d = %s%d;\n",
					w, f, rng.IntN(1000), rng.IntN(1000), 1+rng.IntN(997), w, f, w, f)
			}
			steps = append(steps, struct{ name, body string }{fmt.Sprintf("lib/m%d.js", j), b.String()})
		}
		steps = append(steps, struct{ name, body string }{"index.js", index.String()},
			struct{ name, body string }{"test/index.test.js", fmt.Sprintf("const m = require('..');\nconsole.log(Object.keys(m).length === %d ? 'ok' : 'fail');\n", libs)})
		for _, s := range steps {
			if err := put(path.Join(name, s.name), s.body, 0o644); err != nil {
				return files, err
			}
		}
	}
	return files, nil
}
