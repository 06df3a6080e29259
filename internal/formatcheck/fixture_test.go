package formatcheck

// The fixtures the reader is tested on, and the manifests their writer left
// beside them (gen_test.go writes both).

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Expect is what a path looked like in the mounted sandbox when the fixture
// was made (gen_test.go).
type Expect struct {
	Type    string            `json:"type"`
	Mode    uint32            `json:"mode,omitempty"`
	Content string            `json:"blake3,omitempty"` // of the file's content
	Size    int64             `json:"size,omitempty"`
	Target  string            `json:"target,omitempty"`
	Rdev    uint64            `json:"rdev,omitempty"`
	MtimeNs int64             `json:"mtime_ns,omitempty"`
	Xattrs  map[string]string `json:"xattrs,omitempty"`
}

// Manifest is what the writer wrote into a fixture bucket, recorded by the
// generator beside it (testdata/NAME.json).
type Manifest struct {
	Checkpoints map[string]CheckpointManifest `json:"checkpoints"`
	Refs        map[string]RefManifest        `json:"refs"`            // object name -> what it names
	Marks       map[string][]string           `json:"marks,omitempty"` // mark object -> record IDs
	KeyFile     string                        `json:"key_file,omitempty"`
}

// CheckpointManifest is one record as its writer made it, and the files
// its sandbox showed.
type CheckpointManifest struct {
	Version    int               `json:"version"`
	Class      string            `json:"class"`
	SandboxID  string            `json:"sandbox_id,omitempty"`
	Conv       string            `json:"conv,omitempty"`
	ProcChange string            `json:"proc_change,omitempty"`
	Files      map[string]Expect `json:"files"`
	// Journal is what the record's journal holds, by file name.
	Journal map[string]JournalExpect `json:"journal,omitempty"`
	// ProcImage says the record names a process image.
	ProcImage bool `json:"proc_image,omitempty"`
}

// JournalExpect is one model exchange: BLAKE3 of its request and response.
type JournalExpect struct {
	Request  string `json:"request"`
	Response string `json:"response"`
}

// RefManifest is a ref's target and, for a pushed head, its owner line.
type RefManifest struct {
	Target string `json:"target"`
	Owner  string `json:"owner,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
}

// Damage names the objects testdata/damaged breaks (gen_test.go).
type Damage struct {
	Flipped   string `json:"flipped"`   // a pack with one byte changed
	Truncated string `json:"truncated"` // a record cut short
	Missing   string `json:"missing"`   // a record a head names, deleted
}

// TestFixtureStoresReadFromTheDocument reads every fixture: "store",
// written before sandbox ids and chunk lists (record and tree version 1),
// and "store-v3", written with the first chunk lists (local stores, both
// from older writers, which every later reader must still read); "bucket"
// and "sealed", buckets today's writer pushed (gen_test.go), the second
// from an encrypted home with keyed content IDs, and "sealed-plainlocal",
// the bucket of an encrypted home whose local store is plaintext.
func TestFixtureStoresReadFromTheDocument(t *testing.T) {
	common := []string{"zstd blob", "empty file", "file of several chunks", "residue dir", "whiteout", "opaque dir",
		"hardlink in a layer", "tree version 1", "file", "dir", "symlink", "hardlink", "class fs"}
	today := append(common, "tree version 2", "tree version 3", "chunk list", "sparse file", "record version 2",
		"record version 3", "class skip", "journal", "journal chain", "journal delta", "owner line", "mark object", "chardev", "blockdev", "fifo")
	t.Run("store", func(t *testing.T) {
		readFixture(t, "store", legacyManifest(t, "expected.json"), append(common, "record version 1", "legacy sandbox"))
	})
	t.Run("store-v3", func(t *testing.T) {
		readFixture(t, "store-v3", legacyManifest(t, "expected-v3.json"), append(common, "chunk list", "tree version 3", "record version 2"))
	})
	t.Run("bucket", func(t *testing.T) {
		readFixture(t, "bucket", manifest(t, "bucket.json"), append(today, "socket", "blob stored as the other type",
			"record version 4", "process image"))
	})
	t.Run("sealed", func(t *testing.T) {
		readFixture(t, "sealed", manifest(t, "sealed.json"), append(today, "encrypted store", "keyed content IDs", "sealed pack", "sealed object"))
	})
	t.Run("sealed-plainlocal", func(t *testing.T) {
		readFixture(t, "sealed-plainlocal", manifest(t, "sealed-plainlocal.json"), append(today, "encrypted store", "keyed content IDs",
			"sealed pack", "sealed object", "pack named by its plaintext layout"))
	})
}

// TestDamagedStoreIsReportedByObject reads a copy of "store" with a byte of
// a pack flipped, a record cut short and a head's record deleted: each
// damage is an error naming its object.
func TestDamagedStoreIsReportedByObject(t *testing.T) {
	var d Damage
	data, err := os.ReadFile(filepath.Join("testdata", "damaged.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	r := openStore(t, filepath.Join("testdata", "damaged"), "")
	readAll(r, legacyManifest(t, "expected.json"))
	for what, name := range map[string]string{"flipped byte in": d.Flipped, "truncated": d.Truncated, "missing": d.Missing} {
		found := false
		for _, err := range r.errs {
			found = found || strings.Contains(err.Error(), name)
		}
		if !found {
			t.Errorf("no error names the %s object %s; the reader said: %v", what, name, errors.Join(r.errs...))
		}
	}
	if len(r.errs) == 0 {
		t.Fatal("the damaged store read without an error")
	}
	for _, err := range r.errs {
		t.Log(err)
	}
}

func manifest(t *testing.T, name string) *Manifest {
	var m Manifest
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

// legacyManifest reads the expectations of the older fixtures: only what
// each checkpoint's sandbox showed.
func legacyManifest(t *testing.T, name string) *Manifest {
	var files map[string]map[string]Expect
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &files); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Checkpoints: map[string]CheckpointManifest{}}
	for x, f := range files {
		m.Checkpoints[x] = CheckpointManifest{Files: f}
	}
	return m
}

func readFixture(t *testing.T, store string, want *Manifest, exercised []string) {
	keyFile := ""
	if want.KeyFile != "" {
		keyFile = filepath.Join("testdata", want.KeyFile)
	}
	r := openStore(t, filepath.Join("testdata", store), keyFile)
	readAll(r, want)
	for _, err := range r.errs {
		t.Error(err)
	}
	for _, what := range exercised {
		if r.seen[what] == 0 {
			t.Errorf("the fixture has no %s: regenerate it (gen_test.go)", what)
		}
	}
}

// readAll reads every record, ref, sandbox and mark object of the store
// and compares them with the manifest; damage goes to r.errs.
func readAll(r *reader, want *Manifest) {
	records := map[string]record{}
	var names []string
	for name := range r.objects {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasPrefix(name, "records/") {
			r.try(func() { records[strings.TrimPrefix(name, "records/")] = r.readRecord(name) })
		}
	}
	for hexID := range want.Checkpoints {
		if r.objects["records/"+hexID] == nil {
			r.errs = append(r.errs, fmt.Errorf("record records/%s: the writer wrote it, the store lacks it", hexID))
		}
	}
	for hexID, rec := range records {
		r.try(func() { r.checkRecord(hexID, rec, records, want) })
	}
	for _, name := range names {
		r.try(func() { r.checkObject(name, records, want) })
	}
	for name, ref := range want.Refs {
		if r.objects[name] == nil {
			r.errs = append(r.errs, fmt.Errorf("ref %s naming %s: missing", name, ref.Target))
		}
	}
}

// TestReaderImportsNoTurnsnapPackage keeps the reader honest: only the
// generator may use turnsnap's own code.
func TestReaderImportsNoTurnsnapPackage(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "gen_test.go" {
			continue
		}
		pf, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range pf.Imports {
			if strings.HasPrefix(strings.Trim(im.Path.Value, `"`), "github.com/turnsnap/") {
				t.Errorf("%s imports %s: the reader must work from docs/FORMAT.md alone", f, im.Path.Value)
			}
		}
	}
}

// TestSealedDamageIsReportedByObject damages a copy of the encrypted
// bucket: a byte of a sealed tag flipped, and one sandbox object stored
// under the other's name (the seal binds the name, "Encrypted stores").
// Each is an error naming its object.
func TestSealedDamageIsReportedByObject(t *testing.T) {
	want := manifest(t, "sealed.json")
	src := filepath.Join("testdata", "sealed")
	dst := t.TempDir()
	var sandboxes []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := filepath.ToSlash(strings.TrimPrefix(p, src+"/"))
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if name == "refs/tags/good" {
			b[len(b)/2] ^= 1
		}
		if strings.HasPrefix(name, "sandboxes/") {
			sandboxes = append(sandboxes, name)
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(name)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, name), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(sandboxes)
	if len(sandboxes) < 2 {
		t.Fatal("the sealed fixture has fewer than two sandboxes")
	}
	b, err := os.ReadFile(filepath.Join(dst, sandboxes[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, sandboxes[1]), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := openStore(t, dst, filepath.Join("testdata", want.KeyFile))
	readAll(r, want)
	for _, name := range []string{"refs/tags/good", sandboxes[1]} {
		found := false
		for _, err := range r.errs {
			found = found || strings.Contains(err.Error(), "object "+name+": sealed bytes do not open")
		}
		if !found {
			t.Errorf("no error says %s does not open; the reader said: %v", name, errors.Join(r.errs...))
		}
	}
	if len(r.errs) != 2 {
		t.Errorf("%d errors for two damaged objects: %v", len(r.errs), errors.Join(r.errs...))
	}
}
