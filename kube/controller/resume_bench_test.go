package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	v1 "github.com/turnsnap/turnsnap/kube/api/v1alpha1"
)

// BenchmarkScaleKubeResume measures the first command in a sandbox resumed
// on another node through the CRDs and the controller, lazily (restore
// Lazy, on n2) against a full materialisation (restore Full, on n3: the
// baseline, same run), each from the bucket alone: two sandboxes of the
// same content run on n1 and are suspended (their final checkpoint in
// MinIO), then each is resumed by a spec change. Timed from that change to
// the end of a first command (a shell reading a configuration file and
// listing a directory in the sandbox's root on its node); the resume
// includes the node's catalog rebuild from the bucket, as any node that
// never saw the checkpoint does. The lazy sandbox's fetch-ahead is left to
// finish (its Filled condition true, reported as lazy_whole_s) before the
// baseline starts, so the two do not share the machine.
//
// Layer: 1.4 GiB (20,000 files of 16 KiB in 200 directories and 17 of
// 64 MiB); small: 400 files and 2 of 8 MiB. Each node agent's home is on
// an ext4 of its own (fleetOptions.diskSize), as nodes have their own
// disks: on one shared ext4 the suspend's removal of the layer from n1
// made every file create on n2 scan the freed inodes (ext4's
// recently_deleted, 70% of a profile of the node), for minutes.
//
// Metrics: lazy_first_cmd_s, full_first_cmd_s, full/lazy, lazy_whole_s,
// rebuild_s (a node's catalog rebuild from this bucket, timed alone
// afterwards: each resume above includes one), layer_MiB, load1 at the
// start and the end. The log splits each resume: until the controller
// recorded it (status.action), until it ran, until the first command.
//
// Run: go test -tags turnsnaptest -run '^$' -bench ScaleKubeResume -benchtime 1x ./kube/controller/
func BenchmarkScaleKubeResume(b *testing.B) {
	small, dirs, big, bigSize := benchenv.Size(20000, 400), benchenv.Size(200, 8), benchenv.Size(17, 2), benchenv.Size(64<<20, 8<<20)
	long := time.Duration(benchenv.Size(30, 5)) * time.Minute
	f := newFleetWith(b, fleetOptions{nodes: 3, diskSize: int64(benchenv.Size(8<<30, 1<<30))})
	f.startController()
	loadStart := benchenv.Load1(b)
	var lazyT, fullT, wholeT, rebuildT time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		names := [2]string{fmt.Sprintf("rl%d", i), fmt.Sprintf("rf%d", i)}
		for _, name := range names {
			sb := newSandbox(b, f, name, v1.TurnsnapSandboxSpec{Base: f.base, NodeName: "n1"})
			writeLayer(b, rootOf(b, f, sb), small, dirs, big, bigSize)
		}
		for _, name := range names {
			setSpec(b, f, name, func(s *v1.TurnsnapSandboxSpec) { s.Suspend = true })
			waitFor(b, f, &v1.TurnsnapSandbox{}, name, long, func(s *v1.TurnsnapSandbox) bool { return s.Status.Phase == v1.SandboxSuspended })
		}
		b.StartTimer()
		lazyT += resumeTo(b, f, names[0], "n2", v1.RestoreLazy)
		b.StopTimer()
		t0 := time.Now()
		sb := waitFor(b, f, &v1.TurnsnapSandbox{}, names[0], long, func(s *v1.TurnsnapSandbox) bool {
			return meta.IsStatusConditionTrue(s.Status.Conditions, v1.ConditionFilled)
		})
		wholeT += time.Since(t0)
		if !sb.Status.LastRestore.Lazy {
			b.Fatalf("resume with restore Lazy: receipt %+v", sb.Status.LastRestore)
		}
		b.StartTimer()
		fullT += resumeTo(b, f, names[1], "n3", v1.RestoreFull)
		b.StopTimer()
		// What the node's catalog rebuild from the bucket costs, part of
		// each resume above (neither node knew the checkpoints), timed
		// alone on n1.
		t0 = time.Now()
		if _, err := f.agentNamed("n1").c.RebuildCatalog(context.Background(), api.RebuildRequest{}); err != nil {
			b.Fatal(err)
		}
		rebuildT += time.Since(t0)
	}
	n := float64(b.N)
	b.ReportMetric(lazyT.Seconds()/n, "lazy_first_cmd_s")
	b.ReportMetric(fullT.Seconds()/n, "full_first_cmd_s")
	b.ReportMetric(fullT.Seconds()/lazyT.Seconds(), "full/lazy")
	b.ReportMetric(wholeT.Seconds()/n, "lazy_whole_s")
	b.ReportMetric(rebuildT.Seconds()/n, "rebuild_s")
	b.ReportMetric(float64(int64(small)*16<<10+int64(big)*int64(bigSize))/(1<<20), "layer_MiB")
	b.ReportMetric(loadStart, "load1_start")
	b.ReportMetric(benchenv.Load1(b), "load1_end")
}

// writeLayer writes the benchmark's layer into root: small files of
// 16 KiB in dirs directories, big files of bigSize, and app/config.json
// (what the first command reads). The same every time (a fixed seed).
func writeLayer(b *testing.B, root string, small, dirs, big, bigSize int) {
	rng := rand.NewChaCha8([32]byte{9})
	data := make([]byte, 16<<10)
	for i := range small {
		p := filepath.Join(root, "src", fmt.Sprintf("pkg%03d", i%dirs), fmt.Sprintf("mod%05d.py", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		_, _ = rng.Read(data)
		writeFile(b, p, string(data))
	}
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o755); err != nil {
		b.Fatal(err)
	}
	blob := make([]byte, bigSize)
	for i := range big {
		_, _ = rng.Read(blob)
		if err := os.WriteFile(filepath.Join(root, "data", fmt.Sprintf("blob%02d.bin", i)), blob, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "app"), 0o755); err != nil {
		b.Fatal(err)
	}
	writeFile(b, filepath.Join(root, "app/config.json"), `{"port": 8080}`+"\n")
}

// setSpec changes sandbox name's spec with a merge patch.
func setSpec(b *testing.B, f *fleet, name string, change func(*v1.TurnsnapSandboxSpec)) {
	var sb v1.TurnsnapSandbox
	if err := f.k.Get(context.Background(), crclient.ObjectKey{Namespace: "work", Name: name}, &sb); err != nil {
		b.Fatal(err)
	}
	patch := crclient.MergeFrom(sb.DeepCopy())
	change(&sb.Spec)
	if err := f.k.Patch(context.Background(), &sb, patch); err != nil {
		b.Fatal(err)
	}
}

// resumeTo resumes the suspended sandbox name on node with mode, and
// returns the time from the spec change to the end of the first command
// in its root. It polls the API server every 10 ms (a client waiting for
// the sandbox), then the node for the root.
func resumeTo(b *testing.B, f *fleet, name, node string, mode v1.RestoreMode) time.Duration {
	start := time.Now()
	setSpec(b, f, name, func(s *v1.TurnsnapSandboxSpec) { s.Suspend, s.NodeName, s.Restore = false, node, mode })
	deadline := start.Add(30 * time.Minute)
	var sb v1.TurnsnapSandbox
	var acting, made time.Duration // until the controller recorded the resume on node (status.action); until the node listed the sandbox
	a := f.agentNamed(node)
	for {
		if err := f.k.Get(context.Background(), crclient.ObjectKey{Namespace: "work", Name: name}, &sb); err != nil {
			b.Fatal(err)
		}
		if acting == 0 && sb.Status.Action == actionResume && sb.Status.Node == node {
			acting = time.Since(start)
		}
		if acting != 0 && made == 0 {
			if have, err := a.c.GetSandbox(context.Background(), sb.Status.SandboxName); err == nil && have.Origin.String() == sb.Status.DurableCheckpoint {
				made = time.Since(start)
			}
		}
		if running(&sb) && sb.Status.Node == node {
			break
		}
		if sb.Status.Phase == v1.SandboxFailed || time.Now().After(deadline) {
			b.Fatalf("resume of %s on %s (%s): %+v", name, node, mode, sb.Status)
		}
		time.Sleep(10 * time.Millisecond) // polling the API server
	}
	ran := time.Since(start)
	root := rootOf(b, f, &sb)
	out, err := exec.Command("sh", "-c", "cat "+root+"/app/config.json && ls "+root+"/src/pkg000 | wc -l").CombinedOutput()
	took := time.Since(start)
	if err != nil || !strings.HasPrefix(string(out), `{"port": 8080}`) {
		b.Fatalf("first command in %s on %s: %q %v", name, node, out, err)
	}
	b.Logf("resume of %s on %s (restore %s): first command after %v (the controller acting after %v, the node listing it after %v, running after %v); receipt %+v",
		name, node, mode, took, acting, made, ran, sb.Status.LastRestore)
	return took
}
