// Package monorepo generates a big repository for the real-size benchmarks
// (issue 27, "A big repository"): a deterministic, seeded tree with the mix
// of a monorepo checked out on a developer's machine: source files (small
// text, some near-duplicates of others), vendored dependencies (many small
// files in deep directories), a few large binaries (incompressible and
// compressible), and a .git directory (a pack, loose objects, refs). Modes,
// mtimes and symlinks vary. The same Options write the same tree, byte for
// byte and stat for stat, whatever the number of writers.
package monorepo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"time"
)

// Sizes of the repository: 150,000 files and 1.4 GiB (a hosted
// sandbox's snapshot of a repository of this size timed out at 60 s), and
// the small size of `make test`'s quick run.
const (
	FullFiles  = 150_000
	FullBytes  = 1400 << 20
	SmallFiles = 3_000
	SmallBytes = 30 << 20
)

// Options says what to generate.
type Options struct {
	Seed  uint64
	Files int   // entries that are not directories (files and symlinks), at least 200
	Bytes int64 // total file bytes, at least 1 MiB
	// Workers writing files at once (0: 8; the writes are small and mostly
	// wait for the filesystem, so more writers than cores pay off).
	Workers int
}

// Kind is what an entry holds.
type Kind uint8

const (
	Text       Kind = iota // source-like text
	NearDup                // a copy of an earlier text file with one line changed
	Random                 // incompressible bytes (media, compressed archives, git packs)
	Structured             // compressible binary (databases, build caches)
	Symlink                // a relative symbolic link
)

// Entry is one file or symlink of the tree, in the order of the plan.
type Entry struct {
	Path   string // slash-separated, relative to the tree's root
	Kind   Kind
	Size   int64
	Mode   uint32 // permission bits
	Mtime  time.Time
	Seed   uint64
	Of     int    // NearDup: the index of the entry copied
	Target string // Symlink: its target
}

// Tree is a generated (or planned) repository.
type Tree struct {
	Entries []Entry
	Dirs    []string // every directory, parents first
	Bytes   int64
	// Sources are the indexes of the text files an agent would edit
	// (source files outside the vendored dependencies and .git).
	Sources []int
}

// epoch is the newest mtime of a planned file: fixed, so that plans
// do not depend on the day they run.
var epoch = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)

// Plan lays out the tree o describes without writing anything.
func Plan(o Options) (*Tree, error) {
	if o.Files < 200 || o.Bytes < 1<<20 {
		return nil, fmt.Errorf("monorepo: %d files and %d bytes: want at least 200 files and 1 MiB", o.Files, o.Bytes)
	}
	p := &planner{rng: rand.New(rand.NewPCG(o.Seed, 0x6d6f6e6f)), t: &Tree{}, dirs: map[string]bool{}}
	p.binaries(o.Bytes)
	p.git(o.Files, o.Bytes)
	rest := o.Files - len(p.t.Entries)
	sources := rest * 2 / 5
	p.sources(sources)
	p.vendored("third_party/node_modules", rest-sources, p.rng.Uint64())
	p.fitText(o.Bytes)
	return p.t, nil
}

// PlanInstall lays out a dependency install of files entries under dir
// (say "node_modules"): packages of small files in deep directories, with
// .bin symlinks, about 2 KiB a file, as `npm install` leaves them.
func PlanInstall(seed uint64, dir string, files int) *Tree {
	p := &planner{rng: rand.New(rand.NewPCG(seed, 0x696e7374)), t: &Tree{}, dirs: map[string]bool{}}
	p.vendored(dir, files, seed)
	return p.t
}

type planner struct {
	rng  *rand.Rand
	t    *Tree
	dirs map[string]bool
}

func (p *planner) add(e Entry) int {
	if e.Seed == 0 {
		e.Seed = p.rng.Uint64()
	}
	if e.Mtime.IsZero() {
		e.Mtime = p.mtime()
	}
	p.mkdir(path.Dir(e.Path))
	p.t.Entries = append(p.t.Entries, e)
	p.t.Bytes += e.Size
	return len(p.t.Entries) - 1
}

// mkdir records dir and its parents, parents first.
func (p *planner) mkdir(dir string) {
	if dir == "." || p.dirs[dir] {
		return
	}
	p.mkdir(path.Dir(dir))
	p.dirs[dir] = true
	p.t.Dirs = append(p.t.Dirs, dir)
}

// mtime is within the two years before epoch, to the nanosecond (as a
// checkout on ext4 has them).
func (p *planner) mtime() time.Time {
	return epoch.Add(-time.Duration(p.rng.Int64N(int64(2 * 365 * 24 * time.Hour))))
}

// binaries are five large files, a third of the bytes: alternately
// incompressible (media, a model, a tool) and compressible (a database,
// a build cache). At full size: 190 MiB down to 33 MiB.
func (p *planner) binaries(total int64) {
	share := total * 34 / 100
	for i, b := range []struct {
		path string
		kind Kind
		part int64
		mode uint32
	}{
		{"assets/models/encoder.bin", Random, 40, 0o644},
		{"testdata/fixtures/catalog.db", Structured, 25, 0o644},
		{"assets/media/walkthrough.mp4", Random, 17, 0o644},
		{"build/cache/objects.tar", Structured, 11, 0o600},
		{"tools/bin/protoc-gen-all", Random, 7, 0o755},
	} {
		size := share * b.part / 100
		p.add(Entry{Path: b.path, Kind: b.kind, Size: size - int64(i)*4093, Mode: b.mode})
	}
}

// git is a clone's .git: one pack of a fifth of the bytes, its index, the
// worktree index, loose objects (2% of the files) and refs (0.5%).
func (p *planner) git(files int, total int64) {
	hex := func() string { return fmt.Sprintf("%016x%016x%08x", p.rng.Uint64(), p.rng.Uint64(), p.rng.Uint32()) }
	pack := hex()
	p.add(Entry{Path: ".git/objects/pack/pack-" + pack + ".pack", Kind: Random, Size: total * 18 / 100, Mode: 0o444})
	p.add(Entry{Path: ".git/objects/pack/pack-" + pack + ".idx", Kind: Random, Size: total / 100, Mode: 0o444})
	p.add(Entry{Path: ".git/index", Kind: Structured, Size: total / 100, Mode: 0o644})
	for _, f := range []string{"HEAD", "config", "description", "packed-refs", "info/exclude", "logs/HEAD",
		"hooks/pre-commit.sample", "hooks/pre-push.sample", "hooks/commit-msg.sample", "hooks/update.sample"} {
		mode := uint32(0o644)
		if path.Dir(f) == "hooks" {
			mode = 0o755
		}
		p.add(Entry{Path: ".git/" + f, Kind: Text, Size: 64 + p.rng.Int64N(4000), Mode: mode})
	}
	for range files / 50 {
		h := hex()
		p.add(Entry{Path: ".git/objects/" + h[:2] + "/" + h[2:], Kind: Random, Size: 100 + p.rng.Int64N(6000), Mode: 0o444})
	}
	for i := range files / 200 {
		dir := []string{"heads/feature", "tags/v1", "remotes/origin"}[i%3]
		p.add(Entry{Path: fmt.Sprintf(".git/refs/%s/r%05d", dir, i), Kind: Text, Size: 41, Mode: 0o644})
	}
}

// sources are n entries of the repository's own code: services of
// packages in directories up to seven deep, a few symlinks, 8% near
// duplicates (generated code, copied files) and some empty files.
func (p *planner) sources(n int) {
	exts := []string{".go", ".go", ".ts", ".tsx", ".py", ".rs", ".java", ".md", ".json", ".yaml", ".proto", ".sh"}
	dirs := []string{"src"}
	depth := map[string]int{"src": 1}
	for range max(n/12, 4) {
		parent := dirs[p.rng.IntN(len(dirs))]
		if depth[parent] >= 7 {
			parent = dirs[p.rng.IntN(min(len(dirs), 40))]
		}
		d := fmt.Sprintf("%s/%s%d", parent, []string{"pkg", "internal", "lib", "api", "cmd", "util", "gen"}[p.rng.IntN(7)], len(dirs))
		dirs = append(dirs, d)
		depth[d] = depth[parent] + 1
	}
	var texts []int
	for i := range n {
		dir := dirs[p.rng.IntN(len(dirs))]
		switch {
		case i%200 == 199 && len(texts) > 0:
			// A link to a sibling file or a directory up the tree, as
			// repositories keep docs and configs.
			p.add(Entry{Path: fmt.Sprintf("%s/link%d", dir, i), Kind: Symlink, Mode: 0o777,
				Target: "../" + path.Base(path.Dir(p.t.Entries[texts[p.rng.IntN(len(texts))]].Path))})
			continue
		case i%12 == 11 && len(texts) > 0:
			of := texts[p.rng.IntN(len(texts))]
			p.add(Entry{Path: fmt.Sprintf("%s/copy%d%s", dir, i, path.Ext(p.t.Entries[of].Path)), Kind: NearDup,
				Size: p.t.Entries[of].Size, Mode: 0o644, Of: of})
			continue
		}
		size := p.textSize(1800)
		if i%100 == 0 {
			size = 0
		}
		mode := uint32(0o644)
		switch p.rng.IntN(100) {
		case 0, 1, 2:
			mode = 0o755
		case 3:
			mode = 0o600
		case 4:
			mode = 0o444
		}
		ix := p.add(Entry{Path: fmt.Sprintf("%s/f%d%s", dir, i, exts[p.rng.IntN(len(exts))]), Kind: Text, Size: size, Mode: mode})
		texts = append(texts, ix)
		p.t.Sources = append(p.t.Sources, ix)
	}
}

// vendored lays out n entries of dependencies below root: packages of
// about 60 files, a fifth of them with their own nested node_modules
// (the deep directories), each with package.json, README, LICENSE (one of
// three texts, so exact duplicates) and a .bin link for every third one.
// A package's files share its install time.
func (p *planner) vendored(root string, n int, seed uint64) {
	licenses := []uint64{seed ^ 1, seed ^ 2, seed ^ 3}
	start := len(p.t.Entries)
	for pkg := 0; len(p.t.Entries)-start < n; pkg++ {
		left := n - (len(p.t.Entries) - start)
		mt := p.mtime()
		dir := fmt.Sprintf("%s/pkg-%d", root, pkg)
		if pkg%7 == 3 {
			dir = fmt.Sprintf("%s/@scope%d/pkg-%d", root, pkg%5, pkg)
		}
		if pkg%5 == 4 && pkg > 5 {
			dir = fmt.Sprintf("%s/pkg-%d/node_modules/dep-%d", root, pkg-5, pkg)
		}
		files := min(left, 20+p.rng.IntN(80))
		add := func(e Entry) {
			e.Mtime = mt
			p.add(e)
		}
		add(Entry{Path: dir + "/package.json", Kind: Text, Size: 300 + p.rng.Int64N(1500), Mode: 0o644})
		if files > 2 {
			add(Entry{Path: dir + "/LICENSE", Kind: Text, Size: 1067, Mode: 0o644, Seed: licenses[pkg%3]})
			add(Entry{Path: dir + "/README.md", Kind: Text, Size: p.textSize(3000), Mode: 0o644})
		}
		if files > 3 && pkg%3 == 0 {
			add(Entry{Path: dir + "/bin/cli.js", Kind: Text, Size: p.textSize(800), Mode: 0o755})
			bin := fmt.Sprintf("%s/.bin/cli-%d", root, pkg)
			add(Entry{Path: bin, Kind: Symlink, Mode: 0o777, Target: relTo(path.Dir(bin), dir+"/bin/cli.js")})
		}
		subdirs := []string{dir + "/lib"}
		for len(p.t.Entries)-start < n && len(p.t.Entries)-start < n-left+files {
			d := subdirs[p.rng.IntN(len(subdirs))]
			if p.rng.IntN(8) == 0 && len(subdirs) < 12 {
				d = fmt.Sprintf("%s/%s", d, []string{"dist", "esm", "cjs", "internal", "types", "utils"}[p.rng.IntN(6)])
				subdirs = append(subdirs, d)
			}
			ext := []string{".js", ".js", ".d.ts", ".map", ".json", ".cjs"}[p.rng.IntN(6)]
			add(Entry{Path: fmt.Sprintf("%s/m%d%s", d, len(p.t.Entries)-start, ext), Kind: Text, Size: p.textSize(2000), Mode: 0o644})
		}
	}
}

// textSize is a skewed size around mean: most files small, a few ten
// times the mean.
func (p *planner) textSize(mean int64) int64 {
	f := p.rng.ExpFloat64()
	return max(1, min(int64(f*float64(mean)), 40*mean))
}

// fitText scales the text files' sizes so that the tree holds total bytes
// (the binaries and .git are sized from it already). Near duplicates keep
// their original's size; LICENSE texts keep theirs.
func (p *planner) fitText(total int64) {
	var text, fixed int64
	for _, e := range p.t.Entries {
		if scalable(e) {
			text += e.Size
		} else if e.Kind != NearDup {
			fixed += e.Size
		}
	}
	var dups int64
	for _, e := range p.t.Entries {
		if e.Kind == NearDup {
			dups += e.Size
		}
	}
	want := total - fixed
	if text+dups <= 0 || want <= 0 {
		return
	}
	scale := float64(want) / float64(text+dups)
	p.t.Bytes = 0
	for i := range p.t.Entries {
		e := &p.t.Entries[i]
		switch {
		case scalable(*e):
			e.Size = max(1, int64(float64(e.Size)*scale))
		case e.Kind == NearDup:
			e.Size = p.t.Entries[e.Of].Size
		}
		p.t.Bytes += e.Size
	}
}

// scalable says whether fitText may resize e: text of the repository's
// own, not empty, not a license (kept identical) nor git's metadata.
func scalable(e Entry) bool {
	return e.Kind == Text && e.Size > 0 && path.Base(e.Path) != "LICENSE" && !strings.HasPrefix(e.Path, ".git/")
}

// relTo is target relative to dir (both slash paths from one root).
func relTo(dir, target string) string {
	d, t := splitPath(dir), splitPath(target)
	i := 0
	for i < len(d) && i < len(t)-1 && d[i] == t[i] {
		i++
	}
	up := slices.Repeat([]string{".."}, len(d)-i)
	return path.Join(append(up, t[i:]...)...)
}

func splitPath(p string) []string {
	var out []string
	for p != "." && p != "/" && p != "" {
		out = append([]string{path.Base(p)}, out...)
		p = path.Dir(p)
	}
	return out
}

// Generate plans the tree o describes and writes it into dir (which must
// be empty or absent) with o.Workers writers.
func Generate(ctx context.Context, dir string, o Options) (*Tree, error) {
	t, err := Plan(o)
	if err != nil {
		return nil, err
	}
	return t, t.Write(ctx, dir, o.Workers)
}
