// Package proc runs a sandbox's processes in an OCI container under runc,
// checkpoints them with CRIU, and tells whether they changed between turns.
//
// Vocabulary:
//
//   - A container is one sandbox's process side: its own pid, mount, ipc,
//     uts, cgroup and network namespaces (loopback only), with the sandbox
//     root as its rootfs. It is named by an id (runc's rules: letters, digits, "_.-").
//   - The keeper is the container's init: a tiny shell loop that only sleeps
//     and reaps orphans, so the sandbox can host commands between turns. It
//     is not a long-lived process of the sandbox and Snapshot leaves it out.
//   - Long-lived processes are those alive at a turn's end (dev servers,
//     REPLs, databases). Commands that ran and exited leave no trace.
//   - An image is a directory of CRIU image files plus turnsnap.json
//     (ImageMeta: the host facts and container options restore needs).
//
// Lifecycle. Start creates and starts a container around a rootfs; Exec runs
// a command to completion with its stdio streamed; ExecDetached starts a
// long-lived process whose stdio stays inside the container; Delete kills
// everything and removes the container. Checkpoint dumps a container to an
// image and leaves it running; Restore starts a NEW container from an image,
// in a fresh pid namespace, so any number of restores of one image run side
// by side on one host.
//
// A turn boundary, with a consistent cut of files and processes:
//
//	cur, _ := rt.Snapshot(ctx, id)
//	changed, why := proc.Changed(base, cur) // base: the last checkpoint's set
//	rt.Pause(ctx, id)                       // freeze: nothing runs from here
//	// ... scan the sandbox root (files) ...
//	if changed {
//		meta, _ := rt.Checkpoint(ctx, id, imageDir, proc.DumpOptions{})
//		// store imageDir's files and meta.Host with the checkpoint
//	}
//	rt.Resume(ctx, id)
//	if changed {
//		base, _ = rt.Baseline(ctx, id) // after the dump's own activity settles
//	}
//
// Checkpoint injects CRIU's parasite into every process, which shows up as
// CPU time and context switches; Baseline waits for that to settle so the
// next comparison does not mistake the dump for activity. After Restore, too,
// take a new Baseline: the restored processes have new host pids and fresh
// CPU counters.
//
// What Changed compares besides process activity: each process's
// references (open files, mappings, cwd, root, executable, bytes queued in
// its pipes and sockets; refs.go) and the container's tmpfs mounts
// (tmpfs.go), because a CRIU image carried forward is only valid while they
// are as it recorded them. Pause records its caller (Holder) so that a
// freeze whose holder died can be found (Freeze, FreezeState.Stale) and
// undone. Containers of different state roots never share a cgroup
// (Runtime.cgroupsPath), and Config.ProbeCache spares a new Runtime the
// host probe (probe.go).
//
// runc does the container work, CRIU the dumps (runc drives CRIU for
// containers; see docs/PROCESSES.md for why). What CRIU itself says and
// keeps is package proc/criu's: its version and features (probed at New),
// its kernel-data cache (kept at New where the host's /run cannot keep it,
// which takes CRIU's kernel probe out of every dump's pause), and the
// statistics of each dump that Checkpoint keeps (ImageMeta.CRIU).
package proc
