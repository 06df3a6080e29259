// Package criu is turnsnap's side of the CRIU binary, apart from runc and
// containers: its version and features, the configuration and kernel-data
// cache it reads, the error lines of its logs, and the files it writes (the
// image's file list, the dump statistics). Package proc drives CRIU through
// runc and uses this package for everything CRIU itself says or keeps.
package criu

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	gocriu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Version is a CRIU version as go-criu reports it:
// major*10000 + minor*100 + sublevel (4.2.1 is 40201). It marshals as text
// ("4.2.1") so recorded host facts stay readable.
type Version int

// String formats v as major.minor.sublevel.
func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}

// ParseVersion parses "4.2" or "4.2.1".
func ParseVersion(s string) (Version, error) {
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, fmt.Errorf("CRIU version %q: want major.minor[.sublevel]: %w", s, errdefs.ErrInvalid)
	}
	var v int
	for i, mul := range []int{10000, 100, 1} {
		if i >= len(parts) {
			break
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil || n < 0 || (i > 0 && n > 99) {
			return 0, fmt.Errorf("CRIU version %q: %w", s, errdefs.ErrInvalid)
		}
		v += n * mul
	}
	return Version(v), nil
}

// MarshalText implements encoding.TextMarshaler.
func (v Version) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (v *Version) UnmarshalText(b []byte) error {
	p, err := ParseVersion(string(b))
	if err != nil {
		return err
	}
	*v = p
	return nil
}

// Features are CRIU's optional abilities on this host, from CRIU's
// FEATURE_CHECK request. None is required; they say which faster paths exist.
type Features struct {
	// MemTrack: soft-dirty memory tracking, which incremental dumps
	// (pre-dump --track-mem) need. Off in this project's kernels, so every
	// dump writes all memory and the content store's chunk dedup does the
	// incremental work.
	MemTrack bool
	// LazyPages: userfaultfd, for restores that fetch memory on demand.
	LazyPages bool
	// PidfdStore: CRIU can keep pidfds to detect pid reuse between dumps.
	PidfdStore bool
}

// Conf is the CRIU configuration every runc-driven dump and restore
// reads, through CRIU_CONFIG_FILE (runc 1.1.5 exposes no flag for these):
//
//   - network-lock nftables: CRIU locks the container's network during a
//     dump. Its default method runs iptables-restore, which Debian 12 does
//     not install by default; nftables goes through libnftables inside CRIU
//     (shipped in the private prefix), so no host tool is needed.
//   - ghost-limit 512M: a process may hold a file that no longer has a name
//     (an executable or library replaced by `go build -o`, `cp` + rename,
//     `pip install --upgrade`, a log deleted while open). CRIU keeps such a
//     file's contents in the image as a "ghost file", by default only up to
//     1 MiB ("Can't dump ghost file ... increase limit"): far below a
//     rebuilt dev server. 512 MiB admits any such binary; the image grows
//     by what the process really holds.
//   - link-remap: a file of the base (the overlay's lower layer) replaced in
//     the sandbox, e.g. a shared library `pip install --upgrade` renamed
//     over, still has a link in the lower layer, so CRIU wants to link it
//     back ("Can't create link remap ... Use link-remap option"). With the
//     option on, the link fails on overlayfs and CRIU keeps the file as a
//     ghost file instead (CRIU's files-reg.c, since 3.17). Only a file
//     deleted while another hard link to it remains visible is linked back
//     into the sandbox root as link_remap.N, which the next turn sees as a
//     new file (docs/PROCESSES.md, limits).
//
// It is not passed as runc's org.criu.config annotation: CRIU 4.1.1 crashes
// (SIGSEGV) parsing network-lock in an RPC configuration file (fixed
// upstream by checkpoint-restore/criu#3051; 4.2.1 reads it), while
// CRIU_CONFIG_FILE is parsed at CRIU's start like a command line by both.
const Conf = `# Written by turnsnap (package proc); see docs/PROCESSES.md.
network-lock nftables
ghost-limit 512M
link-remap
`

// Probe asks the CRIU at path for its version and features through go-criu
// and runs `criu check` with env, quoting CRIU on failure.
func Probe(ctx context.Context, path string, env []string) (Version, Features, error) {
	c := gocriu.MakeCriu()
	c.SetCriuPath(path)
	v, err := c.GetCriuVersion()
	if err != nil {
		return 0, Features{}, fmt.Errorf("proc: CRIU %s: version: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	feat, err := featureCheck(ctx, path)
	if err != nil {
		return 0, Features{}, fmt.Errorf("proc: CRIU %s: feature check: %v: %w", path, err, errdefs.ErrUnavailable)
	}

	cmd := exec.CommandContext(ctx, path, "check")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, Features{}, fmt.Errorf("proc: `%s check` failed: %s: %w", path, QuoteLines(ErrorLines(string(out))), errdefs.ErrUnavailable)
	}
	return Version(v), feat, nil
}

// featureCheck sends CRIU's FEATURE_CHECK request with go-criu's RPC types
// and returns CRIU's answer. go-criu v7.2.0's own Criu.FeatureCheck returns
// the request it was given instead of CRIU's response (every feature asked
// for reads as present), so the exchange is done here: one `criu swrk` over
// a SOCK_SEQPACKET pair, as go-criu does it.
func featureCheck(ctx context.Context, criuPath string) (Features, error) {
	fds, err := unix.Socketpair(unix.AF_LOCAL, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return Features{}, err
	}
	cln, srv := os.NewFile(uintptr(fds[0]), "criu-client"), os.NewFile(uintptr(fds[1]), "criu-server")
	defer cln.Close()
	cmd := exec.CommandContext(ctx, criuPath, "swrk", "3")
	cmd.ExtraFiles = []*os.File{srv} // fd 3 in CRIU
	err = cmd.Start()
	srv.Close()
	if err != nil {
		return Features{}, err
	}
	defer func() { cln.Close(); _ = cmd.Wait() }()
	yes := func() *bool { b := true; return &b }
	req, err := proto.Marshal(&rpc.CriuReq{
		Type:     rpc.CriuReqType_FEATURE_CHECK.Enum(),
		Features: &rpc.CriuFeatures{MemTrack: yes(), LazyPages: yes(), PidfdStore: yes()},
	})
	if err != nil {
		return Features{}, err
	}
	if _, err := cln.Write(req); err != nil {
		return Features{}, err
	}
	buf := make([]byte, 8<<10)
	n, err := cln.Read(buf)
	if err != nil {
		return Features{}, err
	}
	var resp rpc.CriuResp
	if err := proto.Unmarshal(buf[:n], &resp); err != nil {
		return Features{}, err
	}
	if !resp.GetSuccess() {
		return Features{}, fmt.Errorf("CRIU says: %s (errno %d)", resp.GetCrErrmsg(), resp.GetCrErrno())
	}
	f := resp.GetFeatures()
	return Features{MemTrack: f.GetMemTrack(), LazyPages: f.GetLazyPages(), PidfdStore: f.GetPidfdStore()}, nil
}

// harmlessCRIU are CRIU error lines printed on every run here that do not
// mean failure (ENVIRONMENT.md: the RLIMIT_NOFILE line is harmless).
var harmlessCRIU = []string{"Can't setup RLIMIT_NOFILE for self"}

// ErrorLines picks CRIU's own error lines out of a log, in order,
// without the harmless ones; when there are none, its warnings; when there
// are none either, the last lines.
func ErrorLines(log string) []string {
	var errs, warns, all []string
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		all = append(all, line)
		harmless := false
		for _, h := range harmlessCRIU {
			harmless = harmless || strings.Contains(line, h)
		}
		switch {
		case harmless:
		case strings.Contains(line, "Error (") || strings.Contains(line, "Error:"):
			errs = append(errs, line)
		case strings.Contains(line, "Warn "):
			warns = append(warns, line)
		}
	}
	if len(errs) == 0 {
		errs = warns
	}
	if len(errs) == 0 {
		errs = all
	}
	const keep = 12
	if len(errs) > keep {
		errs = errs[len(errs)-keep:]
	}
	return errs
}

// LogErrors quotes the error lines of a CRIU log file (dump.log,
// restore.log), or says why it cannot.
func LogErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no CRIU log: %v)", err)
	}
	return QuoteLines(ErrorLines(string(b)))
}

// QuoteLines joins CRIU's lines into one message.
func QuoteLines(lines []string) string {
	if len(lines) == 0 {
		return "(CRIU said nothing)"
	}
	return "CRIU says: " + strings.Join(lines, " | ")
}
