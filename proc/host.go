package proc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc/criu"
)

// HostFacts are what a process image needs from the host that restores it.
// They are recorded with every image (ImageMeta.Host) and checked by
// CheckRestore before a restore.
type HostFacts struct {
	// Kernel is the kernel release (uname -r).
	Kernel string `json:"kernel"`
	// Arch is the machine (uname -m), e.g. x86_64.
	Arch string `json:"arch"`
	// CPUFlags are the CPU's feature flags (/proc/cpuinfo), sorted. A
	// program may have chosen code paths by them at start (AVX-512, SHA
	// instructions); restored on a CPU without one, it dies of SIGILL.
	CPUFlags []string `json:"cpu_flags"`
	// CRIUVersion is the CRIU that dumped the image; zero from CurrentHost.
	CRIUVersion criu.Version `json:"criu_version"`
}

// CurrentHost reads this host's kernel, architecture and CPU flags. The
// CRIU version is Runtime.Host's to add.
func CurrentHost() (HostFacts, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return HostFacts{}, fmt.Errorf("host facts: uname: %w", err)
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return HostFacts{}, fmt.Errorf("host facts: %w", err)
	}
	return HostFacts{
		Kernel:   unix.ByteSliceToString(u.Release[:]),
		Arch:     unix.ByteSliceToString(u.Machine[:]),
		CPUFlags: cpuFlags(b),
	}, nil
}

// cpuFlags returns the flags of the first CPU in a /proc/cpuinfo text. All
// CPUs of a host share them (the kernel masks what not all CPUs have).
func cpuFlags(cpuinfo []byte) []string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "flags" {
			f := strings.Fields(v)
			slices.Sort(f)
			return slices.Compact(f)
		}
	}
	return nil
}

// CheckRestore tells whether an image dumped on a host with facts recorded
// can be restored on a host with facts current. It refuses, with
// ErrPrecondition and every reason at once, when the architecture differs,
// the current CPU lacks a flag the recorded one had, CRIU is older than the
// one that dumped, or the kernel is an older release: each can make the
// restore fail halfway or the restored process crash later. The checkpoint's
// files do not depend on any of this: the message suggests restoring the
// filesystem only.
func CheckRestore(recorded, current HostFacts) error {
	var why []string
	if recorded.Arch != "" && recorded.Arch != current.Arch {
		why = append(why, fmt.Sprintf("architecture %s, not %s", current.Arch, recorded.Arch))
	}
	have := make(map[string]bool, len(current.CPUFlags))
	for _, f := range current.CPUFlags {
		have[f] = true
	}
	var missing []string
	for _, f := range recorded.CPUFlags {
		if !have[f] {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		why = append(why, fmt.Sprintf("CPU lacks flags %s", strings.Join(missing, " ")))
	}
	if current.CRIUVersion < recorded.CRIUVersion {
		why = append(why, fmt.Sprintf("CRIU %s is older than %s", current.CRIUVersion, recorded.CRIUVersion))
	}
	if olderKernel(current.Kernel, recorded.Kernel) {
		why = append(why, fmt.Sprintf("kernel %s is older than %s", current.Kernel, recorded.Kernel))
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("process image from host (%s, kernel %s, CRIU %s) cannot be restored here: %s; restore the checkpoint's filesystem only (its processes start afresh): %w",
		recorded.Arch, recorded.Kernel, recorded.CRIUVersion, strings.Join(why, "; "), errdefs.ErrPrecondition)
}

// olderKernel compares the numeric major.minor.patch prefixes of two kernel
// releases ("6.18.44-fc-v769"); unparsable releases compare as equal.
func olderKernel(a, b string) bool {
	pa, pb := kernelNums(a), kernelNums(b)
	if pa == nil || pb == nil {
		return false
	}
	return slices.Compare(pa, pb) < 0
}

func kernelNums(rel string) []int {
	head, _, _ := strings.Cut(rel, "-")
	var out []int
	for _, s := range strings.SplitN(head, ".", 3) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil
		}
		out = append(out, n)
	}
	return out
}
