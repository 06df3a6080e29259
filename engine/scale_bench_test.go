package engine

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/catalog"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine/retention"
	"github.com/turnsnap/turnsnap/internal/benchenv"
)

// Scale benchmarks for the history operations (issue 9, item 3): `init` on
// a home with 1,000 checkpoints, `catalog rebuild` of 10,000, `prune` of
// 5,000. TURNSNAP_BENCH_SMALL (the 1x run of `make test`) shrinks each
// tenfold or more. Each reports the operation's time per checkpoint against
// the baseline of committing one checkpoint (measured in the same run, on
// the same home), and the peak Go heap during the operation.

// synthHistory commits n small checkpoints to sandbox name through the
// production commit path (content.Op, packs, record, head, catalog
// transaction and upload queue): each changes one file of a one-file
// writable layer. It returns the mean time of one commit.
func synthHistory(tb testing.TB, e *Engine, name string, n int) time.Duration {
	tb.Helper()
	ctx := context.Background()
	var sb *delta.Sandbox
	var head delta.ID
	must(tb, e.view(ctx, func(tx *catalog.Tx) (err error) {
		if sb, err = tx.Sandbox(delta.SandboxName(name)); err != nil {
			return err
		}
		head, err = tx.GetRef(delta.RefHead, name)
		return err
	}))
	start := time.Now()
	for i := range n {
		op := e.data.repo.Begin()
		data := fmt.Appendf(nil, "synthetic turn %d of %s\n", i, sb.ID)
		chunk := delta.Hash(data)
		_, err := op.SaveBlob(ctx, delta.BlobData, chunk, data)
		must(tb, err)
		tree := (&delta.Tree{Entries: []delta.Entry{{Name: "turn", Type: delta.TypeFile, Mode: 0o644,
			MtimeNs: int64(i), Size: uint64(len(data)), Chunks: []delta.ID{chunk}}}}).Encode()
		tid := delta.Hash(tree)
		_, err = op.SaveBlob(ctx, delta.BlobTree, tid, tree)
		must(tb, err)
		cp := &delta.Checkpoint{Version: delta.RecordVersion, Sandbox: delta.SandboxName(name), SandboxID: sb.ID, Parent: head,
			Turn: i + 1, Class: delta.ClassFS, Backend: sb.Backend, BaseTree: sb.BaseTree, FSTree: tid,
			StateKey: tid, Message: "synthetic", Created: time.Now().UTC()}
		must(tb, e.commit(ctx, op, cp, nil, cp.Roots()))
		head = cp.ID
	}
	return time.Since(start) / time.Duration(max(n, 1))
}

// peakHeap samples the live heap while it runs; stop returns the peak.
func peakHeap() (stop func() uint64) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	var mu sync.Mutex
	done := make(chan struct{})
	var wg sync.WaitGroup
	runtime.GC()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			mu.Lock()
			peak = max(peak, sample[0].Value.Uint64())
			mu.Unlock()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// scaleHome is a home with one real sandbox and n synthetic checkpoints.
func scaleHome(b *testing.B, n int) (*Engine, time.Duration) {
	b.Helper()
	e := newEngine(b)
	_, err := e.CreateSandbox(context.Background(), "s", CreateOptions{Base: richBase(b)})
	must(b, err)
	return e, synthHistory(b, e, "s", n)
}

func reportScale(b *testing.B, n int, op, commit time.Duration, peak uint64) {
	per := op / time.Duration(n)
	b.ReportMetric(op.Seconds(), "s/op-total")
	b.ReportMetric(float64(per.Microseconds()), "µs/checkpoint")
	b.ReportMetric(float64(commit.Microseconds()), "µs/commit-baseline")
	b.ReportMetric(float64(per)/float64(commit), "x-commit")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}

func BenchmarkScaleInit(b *testing.B) {
	n := benchenv.Size(1000, 100)
	srv := startMinIO(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		e, commit := scaleHome(b, n)
		stop := peakHeap()
		b.StartTimer()
		start := time.Now()
		ir, err := e.HomeSetup().Init(context.Background(), remoteCfg(srv.Endpoint, fmt.Sprintf("init%d", i)))
		el := time.Since(start)
		b.StopTimer()
		must(b, err)
		if ir.Queued < 2*n {
			b.Fatalf("init queued %d objects for %d checkpoints", ir.Queued, n)
		}
		reportScale(b, n, el, commit, stop())
	}
}

func BenchmarkScaleRebuild(b *testing.B) {
	n := benchenv.Size(10000, 300)
	for range b.N {
		b.StopTimer()
		e, commit := scaleHome(b, n)
		stop := peakHeap()
		b.StartTimer()
		start := time.Now()
		rep, err := e.Rebuilder().RebuildCatalog(context.Background())
		el := time.Since(start)
		b.StopTimer()
		must(b, err)
		if rep.Checkpoints != n+1 {
			b.Fatalf("rebuild found %d checkpoints, want %d", rep.Checkpoints, n+1)
		}
		reportScale(b, n, el, commit, stop())
	}
}

// BenchmarkScalePrune prunes a history that init queued and nothing
// pushed yet (the queue update is part of the cost), with the bucket's
// deletes.
func BenchmarkScalePrune(b *testing.B) {
	n := benchenv.Size(5000, 200)
	srv := startMinIO(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		e, commit := scaleHome(b, n)
		_, err := e.HomeSetup().Init(context.Background(), remoteCfg(srv.Endpoint, fmt.Sprintf("prune%d", i)))
		must(b, err)
		stop := peakHeap()
		b.StartTimer()
		start := time.Now()
		pr, err := e.Retention().Prune(context.Background(), retention.PruneOptions{KeepLast: 1})
		el := time.Since(start)
		b.StopTimer()
		must(b, err)
		if len(pr.Deleted) != n {
			b.Fatalf("prune deleted %d, want %d", len(pr.Deleted), n)
		}
		reportScale(b, n, el, commit, stop())
		if _, err := e.Remote().Push(context.Background(), PushOptions{}); err != nil {
			b.Fatalf("push after prune: %v", err)
		}
	}
}
