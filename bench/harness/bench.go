package harness

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/bench/trace"
)

// Result is everything one benchmark run measured.
type Result struct {
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Host    Host      `json:"host"`
	Seeds   int       `json:"seeds"`
	// LatencyScale multiplied the traces' model latencies.
	LatencyScale float64 `json:"latency_scale"`
	// Remote: the daemon uploaded to a MinIO remote in the background.
	Remote bool `json:"remote"`
	// BaseBytesUploaded is what uploading the traces' bases took, before
	// the runs (so that no run pays for a base another run shares).
	BaseBytesUploaded int64         `json:"base_bytes_uploaded,omitempty"`
	Runs              []*Run        `json:"runs"`
	Colocate          []*ColoResult `json:"colocate,omitempty"`
}

// Host is where it ran (timings are noisy on a shared machine).
type Host struct {
	CPUs       int       `json:"cpus"`
	LoadBefore []float64 `json:"load_before"`
	LoadAfter  []float64 `json:"load_after"`
	// Load1Mean and Load1Max are the 1-minute load average sampled every
	// 5 s while the bench ran.
	Load1Mean   float64 `json:"load1_mean"`
	Load1Max    float64 `json:"load1_max"`
	GoVersion   string  `json:"go_version"`
	KernelLabel string  `json:"kernel"`
}

// ColoResult is N sandboxes replaying at once: end-to-end time without
// checkpoints and with each checkpointing method.
type ColoResult struct {
	N        int                `json:"n"`
	WallMS   map[string]float64 `json:"wall_ms"`  // by method: the batch's start to its last verifier's end
	Slowdown map[string]float64 `json:"slowdown"` // against fault_free at the same N
	// ExposedP50MS and ExposedP99MS are the gate's delays beyond the
	// model latency over every checkpoint of the N sandboxes.
	ExposedP50MS map[string]float64 `json:"exposed_p50_ms"`
	ExposedP99MS map[string]float64 `json:"exposed_p99_ms"`
	// BytesUploaded is what the pusher uploaded for the method's N
	// sandboxes (absent without a remote).
	BytesUploaded map[string]int64 `json:"bytes_uploaded,omitempty"`
	// Order is the order the methods' batches ran in.
	Order  []string `json:"order"`
	Errors []string `json:"errors,omitempty"`
}

// ColoMethods are the methods the co-location runs compare.
var ColoMethods = []string{FaultFree, Turnsnap, FullPerTurn}

// Bench replays every trace with every method and seed (each crash run with
// its injected crash), then the co-location runs.
func (h *Harness) Bench(ctx context.Context, traces []*trace.Trace) (*Result, error) {
	res := &Result{Started: time.Now().UTC(), Seeds: h.cfg.Seeds, Host: hostInfo(), LatencyScale: h.cfg.LatencyScale, Remote: h.minio != nil}
	stopLoad := sampleLoad(&res.Host)
	defer stopLoad()
	colo := 0
	for _, n := range h.cfg.Colocate {
		colo += n * len(ColoMethods)
	}
	h.mu.Lock()
	h.tot = colo
	if !h.cfg.ColocationOnly {
		for _, t := range traces {
			h.tot += t.SeedCount(h.cfg.Seeds) * len(Methods)
		}
	}
	h.mu.Unlock()
	if h.minio != nil {
		n, err := h.uploadBases(ctx, traces)
		if err != nil {
			return res, err
		}
		res.BaseBytesUploaded = n
	}
	for _, t := range traces {
		if h.cfg.ColocationOnly {
			break
		}
		for seed := 1; seed <= t.SeedCount(h.cfg.Seeds); seed++ {
			crash := h.crashTurn(t, seed)
			for _, m := range Methods {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				c := crash
				if m == FaultFree {
					c = 0
				}
				r := h.replay(ctx, t, m, seed, 0, c)
				res.Runs = append(res.Runs, r)
				h.cfg.Log.Info("run", "trace", t.Name, "seed", seed, "method", m, "crash", c, "correct", r.Correct, "err", r.Err)
				h.step(fmt.Sprintf("%s seed %d %s", t.Name, seed, m))
			}
		}
	}
	for k, n := range h.cfg.Colocate {
		res.Colocate = append(res.Colocate, h.colocate(ctx, traces, n, k))
	}
	stopLoad()
	res.Host.LoadAfter = loadavg()
	res.Seconds = time.Since(res.Started).Seconds()
	return res, nil
}

// colocate replays n sandboxes at once (sandbox i runs trace i mod len),
// once per method, without crashes.
//
// The methods' order rotates with the batch's index k, so that no method
// always runs first (or right after the heaviest batch) on a machine whose
// load drifts.
func (h *Harness) colocate(ctx context.Context, traces []*trace.Trace, n, k int) *ColoResult {
	cr := &ColoResult{N: n, WallMS: map[string]float64{}, Slowdown: map[string]float64{},
		ExposedP50MS: map[string]float64{}, ExposedP99MS: map[string]float64{}}
	if h.minio != nil {
		cr.BytesUploaded = map[string]int64{}
	}
	order := append(slices.Clone(ColoMethods[k%len(ColoMethods):]), ColoMethods[:k%len(ColoMethods)]...)
	cr.Order = order
	for _, m := range order {
		h.drain(ctx)
		up0 := h.uploaded(ctx)
		var exposed []float64
		var last time.Duration // the last sandbox's verifier done
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := h.replay(ctx, traces[i%len(traces)], m, 0, i+1, 0)
				mu.Lock()
				exposed = append(exposed, r.ExposedMS...)
				last = max(last, r.End.Sub(start))
				if r.Err != "" {
					cr.Errors = append(cr.Errors, fmt.Sprintf("%s #%d %s: %s", m, i+1, r.Trace, r.Err))
				}
				mu.Unlock()
				h.step(fmt.Sprintf("co-location N=%d %s", n, m))
			}()
		}
		wg.Wait()
		cr.WallMS[m] = ms(last)
		cr.ExposedP50MS[m], cr.ExposedP99MS[m] = Percentile(exposed, 50), Percentile(exposed, 99)
		if h.minio != nil {
			h.drain(ctx)
			cr.BytesUploaded[m] = h.uploaded(ctx) - up0
		}
	}
	for _, m := range ColoMethods {
		if ff := cr.WallMS[FaultFree]; ff > 0 {
			cr.Slowdown[m] = cr.WallMS[m]/ff - 1
		}
	}
	return cr
}

// uploadBases makes a sandbox of every trace's base and waits for the
// pusher to upload it: every later run of the trace shares the base's
// objects, so the runs' bytes_uploaded are their checkpoints' alone.
func (h *Harness) uploadBases(ctx context.Context, traces []*trace.Trace) (int64, error) {
	h.drain(ctx)
	up0 := h.uploaded(ctx)
	for _, t := range traces {
		base, err := h.base(t)
		if err != nil {
			return 0, err
		}
		name := t.Name + "-base"
		h.c.RemoveSandbox(ctx, name, false)
		if _, err := h.c.CreateSandbox(ctx, api.CreateRequest{Name: name, Base: base}); err != nil {
			return 0, fmt.Errorf("trace %s: the base's sandbox: %w", t.Name, err)
		}
		h.drain(ctx)
		if _, err := h.c.RemoveSandbox(ctx, name, false); err != nil {
			return 0, fmt.Errorf("trace %s: removing the base's sandbox: %w", t.Name, err)
		}
	}
	return h.uploaded(ctx) - up0, nil
}

func hostInfo() Host {
	return Host{CPUs: runtime.NumCPU(), LoadBefore: loadavg(), GoVersion: runtime.Version(), KernelLabel: kernel()}
}
