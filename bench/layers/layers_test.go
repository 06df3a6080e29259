package layers

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func tarOf(t testing.TB, es ...entry) []byte {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			w.Write([]byte(e.body))
		}
	}
	w.Close()
	return buf.Bytes()
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	z.Write(b)
	z.Close()
	return buf.Bytes()
}

func zst(t testing.TB, b []byte) []byte {
	z, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	return z.EncodeAll(b, nil)
}

// layout writes an OCI image layout of the layers (in order) into dir.
func layout(t testing.TB, dir string, layers ...[]byte) {
	blob := func(b []byte) map[string]any {
		sum := sha256.Sum256(b)
		h := hex.EncodeToString(sum[:])
		os.MkdirAll(filepath.Join(dir, "blobs/sha256"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, "blobs/sha256", h), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return map[string]any{"digest": "sha256:" + h, "size": len(b)}
	}
	var ls []map[string]any
	for _, l := range layers {
		d := blob(l)
		d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
		ls = append(ls, d)
	}
	cfg := blob([]byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers"}}`))
	cfg["mediaType"] = "application/vnd.oci.image.config.v1+json"
	m, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mtOCIManifest, "config": cfg, "layers": ls})
	md := blob(m)
	md["mediaType"] = mtOCIManifest
	md["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	os.WriteFile(filepath.Join(dir, "index.json"), idx, 0o644)
	os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// Three layers (plain, gzip, zstd): files, links, a whiteout and an
// opaque directory apply in order.
func TestUnpackOCI(t *testing.T) {
	dir, dst := t.TempDir(), t.TempDir()
	l1 := tarOf(t,
		entry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "etc/motd", body: "one\n"},
		entry{name: "etc/gone", body: "x"},
		entry{name: "usr/bin/tool", body: "#!/bin/sh\n", mode: 0o755},
		entry{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		entry{name: "usr/bin/tool2", typ: tar.TypeLink, link: "usr/bin/tool"},
		entry{name: "cache/a", body: "a"}, entry{name: "cache/sub/b", body: "b"},
		entry{name: "dev/null", typ: tar.TypeChar})
	l2 := gz(tarOf(t,
		entry{name: "etc/.wh.gone", body: ""},
		entry{name: "cache/new", body: "n"},
		entry{name: "cache/.wh..wh..opq", body: ""},
		entry{name: "etc/motd", body: "two\n"}))
	l3 := zst(t, tarOf(t, entry{name: "./srv/data.bin", body: "\x00\xff", mode: 0o600}))
	layout(t, dir, l1, l2, l3)
	if err := UnpackOCI(context.Background(), dir, dst, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"etc/motd": "two\n", "bin/tool": "#!/bin/sh\n", "usr/bin/tool2": "#!/bin/sh\n", "cache/new": "n", "srv/data.bin": "\x00\xff"} {
		if got := read(t, filepath.Join(dst, p)); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"etc/gone", "cache/a", "cache/sub", "dev/null", "etc/.wh.gone", "cache/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s should not exist: %v", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dst, "srv/data.bin")); err != nil || fi.Mode().Perm() != 0o600 || fi.ModTime().Unix() != 1700000000 {
		t.Errorf("srv/data.bin metadata: %v %v", fi, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "usr/bin/tool"))
	b, _ := os.Stat(filepath.Join(dst, "usr/bin/tool2"))
	if !os.SameFile(a, b) {
		t.Error("usr/bin/tool2 is not a hard link of usr/bin/tool")
	}

	// A damaged blob is refused by its digest.
	bad := t.TempDir()
	layout(t, bad, l1)
	blobs, _ := filepath.Glob(filepath.Join(bad, "blobs/sha256/*"))
	for _, f := range blobs {
		if b, _ := os.ReadFile(f); bytes.Equal(b, l1) {
			b[len(b)-1] ^= 1
			os.WriteFile(f, b, 0o644)
		}
	}
	if err := UnpackOCI(context.Background(), bad, t.TempDir(), DefaultLimits); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("damaged layer: %v, want ErrInvalid", err)
	}
}

func TestUnpackTar(t *testing.T) {
	body := tarOf(t, entry{name: "work/app.py", body: "print(1)\n"}, entry{name: "work/.wh.keep", body: "k"})
	for name, b := range map[string][]byte{"base.tar": body, "base.tar.gz": gz(body), "base.tar.zst": zst(t, body)} {
		f := filepath.Join(t.TempDir(), name)
		os.WriteFile(f, b, 0o644)
		dst := t.TempDir()
		if err := UnpackTar(context.Background(), f, dst, DefaultLimits); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if read(t, filepath.Join(dst, "work/app.py")) != "print(1)\n" || read(t, filepath.Join(dst, "work/.wh.keep")) != "k" {
			t.Errorf("%s: not unpacked as written", name)
		}
	}
}

// Hostile archives are refused, and nothing is written outside the root.
func TestHostile(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "victim"), []byte("safe"), 0o644)
	small := Limits{Entries: 10, Bytes: 100, FileBytes: 50, Layers: 2, JSONBytes: 1 << 10}
	cases := map[string][]byte{
		"dotdot":          tarOf(t, entry{name: "../../../" + filepath.Join(outside, "victim"), body: "pwned"}),
		"symlink abs":     tarOf(t, entry{name: "evil", typ: tar.TypeSymlink, link: outside}, entry{name: "evil/victim", body: "pwned"}),
		"symlink rel":     tarOf(t, entry{name: "a/evil", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside}, entry{name: "a/evil/victim", body: "pwned"}),
		"hardlink out":    tarOf(t, entry{name: "h", typ: tar.TypeLink, link: "../../../" + filepath.Join(outside, "victim")}),
		"hardlink via ln": tarOf(t, entry{name: "evil", typ: tar.TypeSymlink, link: outside}, entry{name: "h", typ: tar.TypeLink, link: "evil/victim"}),
		"whiteout out":    tarOf(t, entry{name: "evil", typ: tar.TypeSymlink, link: outside}, entry{name: "evil/.wh.victim"}),
		"big file":        tarOf(t, entry{name: "big", body: string(make([]byte, 60))}),
		"many entries":    tarOf(t, entry{name: "1"}, entry{name: "2"}, entry{name: "3"}, entry{name: "4"}, entry{name: "5"}, entry{name: "6"}, entry{name: "7"}, entry{name: "8"}, entry{name: "9"}, entry{name: "10"}, entry{name: "11"}),
		"over total":      tarOf(t, entry{name: "a", body: string(make([]byte, 45))}, entry{name: "b", body: string(make([]byte, 45))}, entry{name: "c", body: string(make([]byte, 45))}),
	}
	for name, b := range cases {
		root, err := os.OpenRoot(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		err = ApplyLayer(context.Background(), bytes.NewReader(b), root, small)
		root.Close()
		if err == nil {
			t.Errorf("%s: applied", name)
		}
		if got := read(t, filepath.Join(outside, "victim")); got != "safe" {
			t.Fatalf("%s: wrote outside the root: %q", name, got)
		}
	}
	// A header that claims an absurd size is refused before any read.
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	w.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeFifo, Size: 1 << 40, Mode: 0o644})
	root, _ := os.OpenRoot(t.TempDir())
	defer root.Close()
	if err := ApplyLayer(context.Background(), bytes.NewReader(buf.Bytes()), root, small); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("absurd size: %v, want ErrInvalid", err)
	}
	// An index that names a blob outside blobs/ is refused by its digest.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "index.json"), []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"`+mtOCIManifest+`","digest":"sha256:../../etc/passwd","size":10}]}`), 0o644)
	if err := UnpackOCI(context.Background(), dir, t.TempDir(), DefaultLimits); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("digest path: %v, want ErrInvalid", err)
	}
}

// FuzzApplyLayer: any bytes as a layer either apply inside the root or
// fail; nothing outside it changes and nothing panics.
func FuzzApplyLayer(f *testing.F) {
	f.Add(tarOf(f, entry{name: "a/b", body: "x"}, entry{name: "l", typ: tar.TypeSymlink, link: "/"}, entry{name: "l/x", body: "y"}))
	f.Add(gz(tarOf(f, entry{name: "d/.wh..wh..opq"}, entry{name: "d/.wh.x"}, entry{name: "h", typ: tar.TypeLink, link: "a/b"})))
	f.Add(zst(f, tarOf(f, entry{name: "../x", body: "z"})))
	f.Fuzz(func(t *testing.T, b []byte) {
		top := t.TempDir()
		os.WriteFile(filepath.Join(top, "victim"), []byte("safe"), 0o644)
		dst := filepath.Join(top, "root")
		os.Mkdir(dst, 0o755)
		root, err := os.OpenRoot(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		ApplyLayer(context.Background(), bytes.NewReader(b), root, Limits{Entries: 64, Bytes: 1 << 16, FileBytes: 1 << 14, Layers: 1, JSONBytes: 1 << 10})
		ents, _ := os.ReadDir(top)
		if v, _ := os.ReadFile(filepath.Join(top, "victim")); len(ents) != 2 || string(v) != "safe" {
			t.Fatalf("the layer changed what is outside its root: %v", ents)
		}
	})
}
