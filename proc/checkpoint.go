package proc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/proc/criu"
)

// MetaFile is turnsnap's own file in an image directory, beside CRIU's
// *.img files and runc's descriptors.json.
const MetaFile = "turnsnap.json"

// metaFormat is the version of MetaFile's layout.
const metaFormat = 1

// ImageMeta describes an image: what restoring it needs besides CRIU's
// files. Checkpoint writes it to the image directory as MetaFile, so it
// travels with the image wherever the image's files are stored.
type ImageMeta struct {
	Format int `json:"format"`
	// Container is the id of the container that was dumped.
	Container string `json:"container"`
	// Options are the container's StartOptions; Restore recreates the
	// container with them.
	Options StartOptions `json:"options"`
	// Host is the dumping host's facts; Restore checks them (CheckRestore).
	Host  HostFacts `json:"host"`
	Taken time.Time `json:"taken"`
	// Bytes and Files count CRIU's image files (MetaFile excluded).
	Bytes int64 `json:"bytes"`
	Files int   `json:"files"`
	// DumpTime is how long CRIU took, from runc's call to its return.
	DumpTime time.Duration `json:"dump_time"`
	// CRIU is CRIU's own statistics of the dump (frozen time, pages
	// written); nil when CRIU wrote none (an image of an older turnsnap).
	CRIU *criu.DumpStats `json:"criu_stats,omitempty"`
}

// DumpOptions shape a Checkpoint. The zero value works.
//
// Two CRIU options that are off by default are always on, because a
// container's state makes them safe: --tcp-established (a sandbox's only
// network is its loopback, so both ends of every connection are in the
// image; a dev server holding a database connection cannot be dumped
// without it) and --file-locks (locked files are in the sandbox root; a
// database holding a lock cannot be dumped without it).
type DumpOptions struct {
	// Stop ends the container's processes once they are dumped, instead of
	// leaving them running, and removes the container (as Delete would):
	// for moving a sandbox off this host, or a rollback that restores the
	// image under the same id.
	Stop bool
}

// RestoreOptions shape a Restore. The zero value is the only one today;
// the struct keeps Restore's signature stable as options come.
type RestoreOptions struct{}

// alwaysCRIUFlags are passed to every dump and restore; see DumpOptions.
var alwaysCRIUFlags = []string{"--tcp-established", "--file-locks"}

// Checkpoint dumps every process of container id into imageDir (created if
// missing; it must be empty) and, unless DumpOptions.Stop, leaves the
// container as it was: running, or paused if it was paused, which is how
// the consistent cut uses it. CRIU sees the processes frozen either way, so
// the image is one instant. It returns the image's metadata, also written
// to imageDir/MetaFile.
//
// It refuses (ErrPrecondition) while a process of the container has its
// parent outside it, e.g. a command Exec is still running: CRIU would leave
// it out of the image without failing. On a CRIU failure the error quotes
// dump.log's error lines and names the kept work directory.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, opts DumpOptions) (ImageMeta, error) {
	meta := ImageMeta{Format: metaFormat, Container: id, Host: r.host, Taken: time.Now().UTC()}
	set, err := r.Snapshot(ctx, id)
	if err != nil {
		return meta, err
	}
	for _, p := range set.Procs {
		if p.Outside {
			return meta, fmt.Errorf("container %s: process %s has its parent outside the container (a command still running through Exec?); CRIU would leave it out of the image: %w",
				id, p, errdefs.ErrPrecondition)
		}
	}
	if meta.Options, err = r.readOptions(id); err != nil {
		return meta, err
	}
	if imageDir, err = filepath.Abs(imageDir); err != nil { // runc resolves relative paths in the bundle
		return meta, fmt.Errorf("container %s: image dir: %w", id, err)
	}
	if err := emptyDir(imageDir); err != nil {
		return meta, fmt.Errorf("container %s: image dir: %w", id, err)
	}
	work, err := r.workDir("dump", id)
	if err != nil {
		return meta, err
	}
	args := append([]string{"checkpoint", "--image-path", imageDir, "--work-path", work}, alwaysCRIUFlags...)
	if !opts.Stop {
		args = append(args, "--leave-running")
	}
	start := time.Now()
	_, err = r.runc(ctx, r.criuEnv(), append(args, id)...)
	meta.DumpTime = time.Since(start)
	privatise(imageDir) // CRIU writes its files 0644 (private.go)
	log := filepath.Join(work, "dump.log")
	if err != nil {
		msg := criu.LogErrors(log)
		return meta, fmt.Errorf("container %s: checkpoint: %v; %s (work dir %s kept)", id, err, msg, r.keepFailed(work))
	}
	// CRIU only warns about a process in the cgroup but outside the tree;
	// one that appeared after the check above would be silently missing.
	// The agent's own processes (agent.go) are left out on purpose.
	var agent []int
	for _, p := range set.Agent {
		agent = append(agent, p.HostPID)
	}
	if b, _ := os.ReadFile(log); len(leftOut(b, agent)) > 0 {
		msg := criu.LogErrors(log)
		return meta, fmt.Errorf("container %s: checkpoint left out a process outside the container's tree: %s (work dir %s kept): %w",
			id, msg, r.keepFailed(work), errdefs.ErrPrecondition)
	}
	// CRIU writes its statistics into the work directory, which goes now.
	if st, err := criu.ReadDumpStats(filepath.Join(work, criu.StatsDumpFile)); err == nil {
		meta.CRIU = &st
	} else {
		r.log.Warn("no CRIU dump statistics", "container", id, "err", err)
	}
	os.RemoveAll(work)
	if opts.Stop {
		// runc has removed its container; the bundle and network are ours.
		if err := r.Delete(context.WithoutCancel(ctx), id); err != nil {
			return meta, err
		}
	}
	if meta.Bytes, meta.Files, err = dirSize(imageDir); err != nil {
		return meta, fmt.Errorf("container %s: image: %w", id, err)
	}
	if err := writeMeta(imageDir, meta); err != nil {
		return meta, fmt.Errorf("container %s: %w", id, err)
	}
	r.log.Debug("checkpoint", "id", id, "bytes", meta.Bytes, "took", meta.DumpTime)
	return meta, nil
}

// Restore starts a new container newID from the image in imageDir, with
// rootfs as its root: the filesystem must be restored first, to the state
// it had when the image was dumped (CRIU checks files the processes hold
// open). The new container gets fresh pid, network and other namespaces,
// so restores of one image run side by side with each other and with the
// original. Before touching anything it checks the image's host facts
// against this host (CheckRestore, ErrPrecondition). The restored
// processes run on return; take a Baseline before the next comparison.
func (r *Runtime) Restore(ctx context.Context, newID, rootfs, imageDir string, opts RestoreOptions) (ImageMeta, error) {
	if err := checkID(newID); err != nil {
		return ImageMeta{}, err
	}
	if r.exists(newID) {
		return ImageMeta{}, fmt.Errorf("container %s: %w", newID, errdefs.ErrExists)
	}
	meta, err := ReadImageMeta(imageDir)
	if err != nil {
		return meta, err
	}
	if err := CheckRestore(meta.Host, r.host); err != nil {
		return meta, fmt.Errorf("container %s: image of %s: %w", newID, meta.Container, err)
	}
	if st, err := os.Stat(rootfs); err != nil || !st.IsDir() {
		return meta, fmt.Errorf("container %s: rootfs %s is not a directory: %w", newID, rootfs, errdefs.ErrInvalid)
	}
	if imageDir, err = filepath.Abs(imageDir); err != nil {
		return meta, fmt.Errorf("container %s: image dir: %w", newID, err)
	}
	privatise(imageDir) // an image stored before images were made 0600
	bundle, err := r.writeBundle(newID, rootfs, meta.Options)
	if err != nil {
		_ = r.Delete(context.WithoutCancel(ctx), newID)
		return meta, err
	}
	work, err := r.workDir("restore", newID)
	if err != nil {
		_ = r.Delete(context.WithoutCancel(ctx), newID)
		return meta, err
	}
	args := append([]string{"restore", "--detach", "--image-path", imageDir, "--work-path", work, "--bundle", bundle}, alwaysCRIUFlags...)
	if _, err := r.runc(ctx, r.criuEnv(), append(args, newID)...); err != nil {
		msg := criu.LogErrors(filepath.Join(work, "restore.log"))
		_ = r.Delete(context.WithoutCancel(ctx), newID)
		return meta, fmt.Errorf("container %s: restore from %s: %v; %s (work dir %s kept)", newID, imageDir, err, msg, r.keepFailed(work))
	}
	os.RemoveAll(work)
	st, err := r.State(ctx, newID)
	if err == nil && st.InitPID > 0 {
		err = clearAgentState(st.InitPID)
	}
	if err != nil {
		_ = r.Delete(context.WithoutCancel(ctx), newID)
		return meta, fmt.Errorf("container %s: restored from %s: empty the agent's state %s: %w", newID, imageDir, AgentStateDir, err)
	}
	return meta, nil
}

// ReadImageMeta reads imageDir/MetaFile. A directory without one is not a
// turnsnap image (ErrNotFound); one that does not decode is ErrCorrupt.
func ReadImageMeta(imageDir string) (ImageMeta, error) {
	var m ImageMeta
	b, err := os.ReadFile(filepath.Join(imageDir, MetaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("image %s: no %s: %w", imageDir, MetaFile, errdefs.ErrNotFound)
	}
	if err != nil {
		return m, fmt.Errorf("image %s: %w", imageDir, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("image %s: %s: %v: %w", imageDir, MetaFile, err, errdefs.ErrCorrupt)
	}
	if m.Format != metaFormat {
		return m, fmt.Errorf("image %s: %s format %d, want %d: %w", imageDir, MetaFile, m.Format, metaFormat, errdefs.ErrCorrupt)
	}
	return m, nil
}

func writeMeta(imageDir string, m ImageMeta) error {
	b, err := json.MarshalIndent(m, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(imageDir, MetaFile), append(b, '\n'), 0o600)
}

// emptyDir makes sure dir exists and holds nothing: CRIU would mix a new
// dump with an old one's files.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return fmt.Errorf("%s is not empty: %w", dir, errdefs.ErrExists)
	}
	return nil
}

// dirSize sums the sizes of the regular files in dir (not recursive: CRIU
// writes a flat directory).
func dirSize(dir string) (int64, int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	var n int64
	var files int
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == MetaFile {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return 0, 0, err
		}
		n += fi.Size()
		files++
	}
	return n, files, nil
}
