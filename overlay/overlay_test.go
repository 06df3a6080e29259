package overlay

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/fstree"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"golang.org/x/sys/unix"
)

func TestMountOptions(t *testing.T) {
	got, err := MountOptions("/h/bases/b", "/h/s/gen-1/upper", "/h/s/gen-1/work")
	if err != nil || got != "lowerdir=/h/bases/b,upperdir=/h/s/gen-1/upper,workdir=/h/s/gen-1/work,"+
		"redirect_dir=on,index=on,nfs_export=on,metacopy=off,xino=off,uuid=on" {
		t.Fatalf("MountOptions = %q, %v", got, err)
	}
	for _, bad := range []string{"relative", "/a,b", "/a:b", `/a\b`} {
		if _, err := MountOptions(bad, "/u", "/w"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("lower %q accepted: %v", bad, err)
		}
	}
}

// TestCheckSuperOptions checks the options a mount really got, as the
// kernel lists them (defaults that are off are not listed), layers first.
func TestCheckSuperOptions(t *testing.T) {
	const feats = ",redirect_dir=on,index=on,uuid=on,nfs_export=on"
	for _, good := range []struct{ vfs, layers string }{
		{"rw," + hiddenLayers + feats, hiddenLayers},
		{"rw,lowerdir=/l,upperdir=/u,workdir=/w" + feats, pathLayers("/l", "/u", "/w")},
		{`rw,lowerdir=/a\040b,upperdir=/u,workdir=/w` + feats, pathLayers("/a b", "/u", "/w")},
	} {
		if err := checkSuperOptions(good.vfs, good.layers); err != nil {
			t.Errorf("the options this kernel reports were refused: %v", err)
		}
	}
	for _, bad := range []string{
		"rw,lowerdir=/l,upperdir=/u,workdir=/w,redirect_dir=on,uuid=on,nfs_export=on",                      // index fell back to off
		"rw,lowerdir=/l,upperdir=/u,workdir=/w,redirect_dir=on,index=on,uuid=on,nfs_export=on,metacopy=on", // metacopy on
		"rw,lowerdir=/l,upperdir=/u,workdir=/w,redirect_dir=follow,index=on,uuid=on,nfs_export=on",
		"rw,lowerdir=/l,upperdir=/u,workdir=/w,redirect_dir=on,index=on,uuid=on,nfs_export=on,xino=auto",
		"ro,lowerdir=/l,upperdir=/u,workdir=/w,redirect_dir=on,index=on,uuid=on,nfs_export=on", // workdir unusable
		"rw,lowerdir=/other,upperdir=/u,workdir=/w" + feats,                                    // another lower
		"rw,lowerdir=/l,lowerdir+=/x,upperdir=/u,workdir=/w" + feats,                           // an extra layer
	} {
		if err := checkSuperOptions(bad, pathLayers("/l", "/u", "/w")); !errors.Is(err, errdefs.ErrPrecondition) {
			t.Errorf("options %q accepted: %v", bad, err)
		}
	}
	// A mount meant to hide the host paths must not list them.
	if err := checkSuperOptions("rw,lowerdir=/l,upperdir=/u,workdir=/w"+feats, hiddenLayers); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Errorf("host paths accepted for a descriptor mount: %v", err)
	}
}

func TestTranslate(t *testing.T) {
	wh := delta.Entry{Name: "gone", Type: delta.TypeCharDev, Mode: 0o644, UID: 5, MtimeNs: 9}
	Translate("gone", &unix.Stat_t{}, &wh)
	if wh.Type != delta.TypeWhiteout || wh.Mode != 0 || wh.UID != 0 || wh.MtimeNs != 0 {
		t.Fatalf("0:0 char device not a bare whiteout: %+v", wh)
	}
	dev := delta.Entry{Name: "null", Type: delta.TypeCharDev, Rdev: unix.Mkdev(1, 3)}
	Translate("null", &unix.Stat_t{}, &dev)
	if dev.Type != delta.TypeCharDev {
		t.Fatal("a real device node became a whiteout")
	}
	dir := delta.Entry{Name: "d", Type: delta.TypeDir, Xattrs: []delta.Xattr{
		{Name: "trusted.overlay.impure", Value: []byte("y")},
		{Name: fstree.OpaqueXattr, Value: []byte("y")},
		{Name: "user.keep", Value: []byte("1")},
	}}
	Translate("d", &unix.Stat_t{}, &dir)
	if !dir.Opaque || len(dir.Xattrs) != 1 || dir.Xattrs[0].Name != "user.keep" {
		t.Fatalf("opaque dir translation: %+v", dir)
	}
	stub := delta.Entry{Name: "big", Type: delta.TypeFile, Xattrs: []delta.Xattr{{Name: "trusted.overlay.metacopy"}}}
	if _, err := Translate("big", &unix.Stat_t{}, &stub); !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("a metacopy stub was accepted: %v", err)
	}
	again := dir
	Translate("d", &unix.Stat_t{}, &again) // entries from the scan cache arrive translated
	if !again.Opaque || len(again.Xattrs) != 1 {
		t.Fatalf("Translate is not idempotent: %+v", again)
	}
}

// escapeMountinfo escapes a value as the kernel's mountinfo does
// (seq_escape of " \t\n\\").
func escapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\\':
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// FuzzSuperOptions: the option checker takes any mountinfo text without
// panicking, and a mount(2) mount's layers read back as the paths given,
// whatever mountinfo escaped in them.
func FuzzSuperOptions(f *testing.F) {
	f.Add("rw,"+hiddenLayers+",redirect_dir=on,index=on,uuid=on,nfs_export=on", "/h/bases/b")
	f.Add(`rw,lowerdir=/a\040b,upperdir=/u,workdir=/w`, "/a b")
	f.Add(`\\\1,=,,lowerdir+=`, `/x\y`)
	f.Fuzz(func(t *testing.T, vfs, lower string) {
		checkSuperOptions(vfs, hiddenLayers)
		checkSuperOptions(vfs, pathLayers(lower, "/u", "/w"))
		if checkOptionPath(lower) != nil {
			return
		}
		got := "rw," + pathLayers(escapeMountinfo(lower), "/u", "/w") + ",redirect_dir=on,index=on,uuid=on,nfs_export=on"
		if err := checkSuperOptions(got, pathLayers(lower, "/u", "/w")); err != nil {
			t.Fatalf("lower %q listed as %q: %v", lower, got, err)
		}
	})
}
