package ocispec

// The container's seccomp filter: every system call is allowed except the
// ones below, which fail with EPERM (clone3 with ENOSYS, so that libc falls
// back to clone, whose flags the filter can see). The list follows
// Docker's default profile for a container without CAP_SYS_ADMIN: calls
// the capability set already refuses (mount, module loading, reboot) are
// denied again so that a kernel bug behind them is out of reach, and calls
// that need no capability but are the kernel's usual exploit surface are
// denied outright:
//
//   - new namespaces (unshare, setns, clone with a CLONE_NEW* flag): a user
//     namespace would give its creator every capability over the
//     namespaces it makes, and the mount, network and other code behind
//     them;
//   - keyctl, add_key, request_key (the kernel keyring is not namespaced),
//     bpf, perf_event_open, userfaultfd, io_uring_*;
//   - open_by_handle_at (opens any inode of a filesystem by its handle).
//
// CRIU dumps the filter with the processes (PTRACE_SECCOMP_GET_FILTER; its
// parasite runs with seccomp suspended) and restores it last, so a
// restored container is filtered as the original was; `runc exec` applies
// it to every command. Agents that need nested containers or io_uring
// cannot run under it; that is the point.
type Seccomp struct {
	DefaultAction string        `json:"defaultAction"`
	Architectures []string      `json:"architectures"`
	Syscalls      []SyscallRule `json:"syscalls"`
}

type SyscallRule struct {
	Names    []string     `json:"names"`
	Action   string       `json:"action"`
	ErrnoRet *uint        `json:"errnoRet,omitempty"`
	Args     []SyscallArg `json:"args,omitempty"`
}

type SyscallArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

// deniedSyscalls fail with EPERM in the container. Names the kernel or
// libseccomp does not know for an architecture are skipped by runc.
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
	"delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
	"get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register",
	"io_uring_setup", "ioperm", "iopl", "kexec_file_load", "kexec_load", "keyctl",
	"lookup_dcookie", "mount", "mount_setattr", "move_mount", "nfsservctl",
	"open_by_handle_at", "open_tree", "perf_event_open", "pivot_root",
	"query_module", "quotactl", "quotactl_fd", "reboot", "request_key", "setns",
	"settimeofday", "stime", "swapoff", "swapon", "_sysctl", "sysfs", "umount",
	"umount2", "unshare", "uselib", "userfaultfd", "ustat", "vm86", "vm86old",
}

// cloneNamespaceFlags are clone(2)'s CLONE_NEW* flags: NEWNS, NEWCGROUP,
// NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
var cloneNamespaceFlags = []uint64{0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000}

func sandboxSeccomp() *Seccomp {
	eperm, enosys := uint(1), uint(38)
	rules := []SyscallRule{
		{Names: deniedSyscalls, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm},
		{Names: []string{"clone3"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &enosys},
	}
	// One rule per flag: the rules of a call are alternatives, the
	// conditions of one rule all hold. clone's flags are its first
	// argument on x86-64 (and every architecture listed).
	for _, f := range cloneNamespaceFlags {
		rules = append(rules, SyscallRule{Names: []string{"clone"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
			Args: []SyscallArg{{Index: 0, Value: f, ValueTwo: f, Op: "SCMP_CMP_MASKED_EQ"}}})
	}
	return &Seccomp{
		DefaultAction: "SCMP_ACT_ALLOW",
		Architectures: []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"},
		Syscalls:      rules,
	}
}
