package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/turnsnap/turnsnap/bench/trace"
	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// A v2 trace's base is a copy of its image (a host directory, relative to
// the trace file, or a named image from the cache) with the trace's files
// on top; the image itself is never written, even where a trace file
// replaces one of its files.
func TestBaseFromImage(t *testing.T) {
	root := t.TempDir()
	img := filepath.Join(root, "traces", "rootfs")
	for p, c := range map[string]string{"usr/bin/tool": "#!/bin/sh\necho tool\n", "etc/motd": "image\n"} {
		os.MkdirAll(filepath.Dir(filepath.Join(img, p)), 0o755)
		if err := os.WriteFile(filepath.Join(img, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("usr/bin", filepath.Join(img, "bin"))
	file := filepath.Join(root, "traces", "t.json")
	os.WriteFile(file, []byte(`{"version":2,"name":"img","base":{"image":{"dir":"rootfs"},
 "files":[{"path":"etc/motd","content":"trace\n"},{"path":"work/x","content_b64":"/w=="}]},
 "verify":{"cmd":"true"},"turns":[{"steps":[{"cmd":"true"}]}]}`), 0o644)
	tr, err := trace.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	h := &Harness{cfg: Config{Work: filepath.Join(root, "work"), Cache: filepath.Join(root, "cache")}}
	dir, err := h.base(tr)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"usr/bin/tool": "#!/bin/sh\necho tool\n", "etc/motd": "trace\n", "work/x": "\xff", "bin/tool": "#!/bin/sh\necho tool\n"}
	for p, c := range want {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != c {
			t.Errorf("base %s: %q %v, want %q", p, b, err, c)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "usr/bin/tool")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("image file mode: %v %v", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(img, "etc/motd")); string(b) != "image\n" {
		t.Errorf("the image was written: etc/motd is %q", b)
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		if st, err := os.Stat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			t.Errorf("mount point %s: %v", d, err)
		}
	}

	// A named image: absent from the cache, the error says what builds
	// it; once built (.complete next to rootfs), it is the base.
	named, err := trace.Parse([]byte(`{"version":2,"name":"deb","base":{"image":{"name":"debian-bookworm"}},
 "verify":{"cmd":"true"},"turns":[{"steps":[{"cmd":"true"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.base(named); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("named image not built: %v, want ErrNotFound", err)
	}
	cached := filepath.Join(h.cfg.Cache, "images", "debian-bookworm-v2")
	os.MkdirAll(filepath.Join(cached, "rootfs", "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(cached, "rootfs", "usr/bin/python3"), []byte("py"), 0o755)
	os.WriteFile(filepath.Join(cached, ".complete"), nil, 0o644)
	dir, err = h.base(named)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "usr/bin/python3")); err != nil || string(b) != "py" {
		t.Errorf("named image base: %q %v", b, err)
	}
	if _, err := ImagePath(h.cfg.Cache, "nope"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown image name: %v", err)
	}
}

// A tarball base is unpacked (bounded, inside the base) and the trace's
// files go on top; a symlink of the archive that points out of the base
// does not carry a trace file outside it.
func TestBaseFromTarball(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(root, "outside")
	os.Mkdir(outside, 0o755)
	mk := func(name string, hostile bool) string {
		var buf bytes.Buffer
		z := gzip.NewWriter(&buf)
		w := tar.NewWriter(z)
		w.WriteHeader(&tar.Header{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755})
		w.WriteHeader(&tar.Header{Name: "usr/bin/tool", Typeflag: tar.TypeReg, Mode: 0o755, Size: 5})
		w.Write([]byte("tool\n"))
		if hostile {
			w.WriteHeader(&tar.Header{Name: "work", Typeflag: tar.TypeSymlink, Linkname: outside})
		}
		w.Close()
		z.Close()
		f := filepath.Join(root, name)
		os.WriteFile(f, buf.Bytes(), 0o644)
		return f
	}
	h := &Harness{cfg: Config{Work: filepath.Join(root, "work"), Cache: filepath.Join(root, "cache")}}
	for _, hostile := range []bool{false, true} {
		name := map[bool]string{false: "tgz", true: "evil"}[hostile]
		f := mk(name+".tar.gz", hostile)
		tr, err := trace.Parse([]byte(`{"version":2,"name":"` + name + `","base":{"image":{"tar":"` + f + `"},
 "files":[{"path":"work/x","content":"trace\n"}]},"verify":{"cmd":"true"},"turns":[{"steps":[{"cmd":"true"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		dir, err := h.base(tr)
		if hostile {
			if err == nil {
				t.Error("a trace file was written through the archive's symlink out of the base")
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("written outside the base: %v", ents)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for p, c := range map[string]string{"usr/bin/tool": "tool\n", "work/x": "trace\n"} {
			if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != c {
				t.Errorf("base %s: %q %v, want %q", p, b, err, c)
			}
		}
	}
}
