package proc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/proc/criu"
)

// The host probe (runc --version, CRIU's version and features, `criu
// check`, the host facts) spawns four processes and costs about 160 ms,
// more than a whole skip turn. Its answers change only when a binary or the
// kernel does, so Config.ProbeCache keeps them in a file keyed by the
// identity of every binary involved and the running kernel; New trusts a
// file whose key matches and probes again otherwise.

// probeCacheFormat is the version of the cache file's layout.
const probeCacheFormat = 1

// probeResult is what New learns by probing.
type probeResult struct {
	Runc     string        `json:"runc"`
	CRIU     criu.Version  `json:"criu"`
	Features criu.Features `json:"features"`
	Host     HostFacts     `json:"host"`
}

type probeCache struct {
	Format int         `json:"format"`
	Key    []string    `json:"key"`
	Result probeResult `json:"result"`
}

// fileIdentity names one file's version: path, device, inode, size and
// modification time. A reinstalled or rebuilt binary differs in at least
// one of them (a package upgrade writes a new inode; a rebuild in place a
// new size or mtime).
func fileIdentity(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return path + " missing"
	}
	return fmt.Sprintf("%s dev=%d ino=%d size=%d mtime=%d", path, st.Dev, st.Ino, st.Size, unix.TimespecToNsec(st.Mtim))
}

// scriptTargets returns the absolute paths of existing regular files a
// small #! script names: the CRIU wrapper of scripts/criu-install.sh runs a
// loader and a binary of a private prefix, and a reinstall that replaces
// only those must change the key too.
func scriptTargets(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 16<<10 || !bytes.HasPrefix(b, []byte("#!")) {
		return nil
	}
	var out []string
	for _, w := range strings.FieldsFunc(string(b), func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\n' || r == '"' || r == '\'' || r == ':' || r == '='
	}) {
		if !filepath.IsAbs(w) {
			continue
		}
		if fi, err := os.Stat(w); err == nil && fi.Mode().IsRegular() {
			out = append(out, w)
		}
	}
	return out
}

// probeKey identifies everything the probe's answers depend on.
func probeKey(cfg Config) []string {
	runc, err := exec.LookPath(cfg.Runc)
	if err != nil {
		runc = cfg.Runc
	}
	var u unix.Utsname
	_ = unix.Uname(&u)
	key := []string{
		fmt.Sprintf("format=%d", probeCacheFormat),
		"kernel=" + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:]),
		"criu_fault=" + cfg.CRIUFault,
		fileIdentity(runc),
		fileIdentity(cfg.CRIU),
	}
	for _, t := range scriptTargets(cfg.CRIU) {
		key = append(key, fileIdentity(t))
	}
	return key
}

// loadProbe returns the cached probe for key, if the cache holds one.
func loadProbe(path string, key []string) (probeResult, bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 1<<20 {
		return probeResult{}, false
	}
	return decodeProbe(b, key)
}

// decodeProbe decodes a cache file's bytes; anything but a well-formed file
// of this format with this key is a miss.
func decodeProbe(b []byte, key []string) (probeResult, bool) {
	var c probeCache
	if json.Unmarshal(b, &c) != nil || c.Format != probeCacheFormat || !equalStrings(c.Key, key) {
		return probeResult{}, false
	}
	return c.Result, true
}

// saveProbe writes the cache atomically (temp file, rename), 0600.
func saveProbe(path string, key []string, res probeResult) error {
	b, err := json.MarshalIndent(probeCache{Format: probeCacheFormat, Key: key, Result: res}, "", "\t")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".probe-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
