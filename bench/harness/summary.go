package harness

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Summary is the headline: one row per method and the traces' turn mix.
// It is what `turnsnap bench --json` prints.
type Summary struct {
	Methods  map[string]*MethodSummary `json:"methods"`
	Traces   []TraceSummary            `json:"traces"`
	Colocate []*ColoResult             `json:"colocate,omitempty"`
	Host     Host                      `json:"host"`
	Seconds  float64                   `json:"seconds"`
	// LatencyScale is the factor the traces' model latencies ran at.
	LatencyScale float64 `json:"latency_scale"`
	// Remote: turnsnap uploaded to a MinIO remote during the runs.
	Remote bool `json:"remote"`
	// BaseBytesUploaded is the traces' bases, uploaded before the runs.
	BaseBytesUploaded int64 `json:"base_bytes_uploaded,omitempty"`
	// Invalid lists the traces (and seeds) whose fault-free run failed
	// its verifier or did not finish: a trace that does not pass without
	// a fault measures nothing about recovery, so its runs count in no
	// correctness or equivalence figure.
	Invalid []InvalidTrace `json:"invalid,omitempty"`
	Errors  []string       `json:"errors,omitempty"`
}

// InvalidTrace is one trace and seed whose fault-free run did not pass.
type InvalidTrace struct {
	Trace  string `json:"trace"`
	Seed   int    `json:"seed"`
	Reason string `json:"reason"`
}

// MethodSummary aggregates one method's runs.
type MethodSummary struct {
	Runs int `json:"runs"`
	// ValidRuns are the runs of valid traces (their fault-free run
	// passed its verifier): the correctness figures count only those,
	// and are absent when there are none.
	ValidRuns           int      `json:"valid_runs"`
	RecoveryCorrectness *float64 `json:"recovery_correctness,omitempty"`
	StateEquivalence    *float64 `json:"state_equivalence,omitempty"`
	// EndProbeMatch is the fraction of the runs of valid traces with an
	// end probe (v2) whose probe answered (exit code and output) what the
	// fault-free run's did; absent without such runs.
	EndProbeMatch *float64 `json:"end_probe_match,omitempty"`
	// Overhead is the time the method's checkpoints added to the
	// replays, as a fraction of the fault-free replays of the same traces
	// and seeds: the gate's delays beyond the model latency (a checkpoint
	// runs during the model call; only what outlasts it delays the agent).
	Overhead float64 `json:"overhead"`
	// WallOverhead is the replays' whole time (turns, latencies, gate
	// delays; crash and recovery left out) against fault-free's: it also
	// holds what the checkpoints' work cost the turns' own commands, and
	// the commands' noise.
	WallOverhead float64 `json:"wall_overhead"`
	BytesStored  int64   `json:"bytes_stored"`
	// BytesUploaded is what the daemon's background pusher uploaded to
	// the MinIO remote during the method's runs (-1: no remote; methods
	// that do not checkpoint through turnsnap upload only their bases).
	BytesUploaded int64   `json:"bytes_uploaded"`
	CkptP50MS     float64 `json:"ckpt_p50_ms"`
	CkptP95MS     float64 `json:"ckpt_p95_ms"`
	CkptP99MS     float64 `json:"ckpt_p99_ms"`
	// ExposedP50MS/ExposedP99MS are the gate's delays per checkpoint.
	ExposedP50MS float64 `json:"exposed_p50_ms"`
	ExposedP99MS float64 `json:"exposed_p99_ms"`
	// Overlapped is the fraction of checkpoints that started before their
	// turn's model latency ended.
	Overlapped float64 `json:"overlapped"`
	// Pauses counts the checkpoints that froze the processes;
	// PauseP50MS/PauseP99MS are how long they did.
	Pauses     int     `json:"pauses"`
	PauseP50MS float64 `json:"pause_p50_ms"`
	PauseP99MS float64 `json:"pause_p99_ms"`
	RestoreP50 float64 `json:"restore_p50_ms"`
	RestoreMax float64 `json:"restore_max_ms"`
	WallMS     float64 `json:"wall_ms"`
}

// TraceSummary is one trace's measured turn mix (turnsnap's classes).
type TraceSummary struct {
	Name      string         `json:"name"`
	Turns     int            `json:"turns"`
	Mix       map[string]int `json:"mix"`
	Unchanged float64        `json:"unchanged"` // skip turns / all
	Crashes   []int          `json:"crash_turns"`
	// Invalid says why the trace is invalid (its fault-free run failed);
	// empty when it is valid.
	Invalid string `json:"invalid,omitempty"`
}

// Summarise computes the headline from the runs.
func Summarise(res *Result) *Summary {
	s := &Summary{Methods: map[string]*MethodSummary{}, Colocate: res.Colocate, Host: res.Host, Seconds: res.Seconds, LatencyScale: res.LatencyScale, Remote: res.Remote,
		BaseBytesUploaded: res.BaseBytesUploaded}
	ff := map[[2]any]*Run{}
	invalid := map[[2]any]string{}
	for _, r := range res.Runs {
		if r.Method != FaultFree {
			continue
		}
		k := [2]any{r.Trace, r.Seed}
		ff[k] = r
		switch {
		case r.Err != "":
			invalid[k] = "fault-free run failed: " + r.Err
		case !r.Correct:
			invalid[k] = "fault-free run failed its verifier: " + lastLine(r.VerifyOut)
		}
		if why, ok := invalid[k]; ok {
			s.Invalid = append(s.Invalid, InvalidTrace{Trace: r.Trace, Seed: r.Seed, Reason: why})
		}
	}
	correct := map[string]int{}
	probeOK, probeN := map[string]int{}, map[string]int{}
	ckpts, restores := map[string][]float64{}, map[string][]float64{}
	exposed, pauses := map[string][]float64{}, map[string][]float64{}
	overlapped, workSum := map[string]int{}, map[string]float64{}
	equiv, equivN := map[string]int{}, map[string]int{}
	ckptSum, ffSum := map[string]float64{}, map[string]float64{}
	traces := map[string]*TraceSummary{}
	var order []string
	for _, r := range res.Runs {
		m := s.Methods[r.Method]
		if m == nil {
			m = &MethodSummary{}
			s.Methods[r.Method] = m
		}
		m.Runs++
		// A run of an invalid trace counts in no correctness figure; a
		// trace without a fault-free run (none was made) is not judged.
		_, bad := invalid[[2]any{r.Trace, r.Seed}]
		if f := ff[[2]any{r.Trace, r.Seed}]; !bad && f != nil && f.EndProbe != nil {
			probeN[r.Method]++
			if r.EndProbe != nil && *r.EndProbe == *f.EndProbe {
				probeOK[r.Method]++
			}
		}
		if !bad {
			m.ValidRuns++
			if r.Correct {
				correct[r.Method]++
			}
		}
		if r.Err != "" {
			s.Errors = append(s.Errors, r.Method+" "+r.Trace+": "+r.Err)
		}
		m.BytesStored += r.BytesStored
		m.WallMS += r.WallMS
		ckpts[r.Method] = append(ckpts[r.Method], r.CkptMS...)
		exposed[r.Method] = append(exposed[r.Method], r.ExposedMS...)
		pauses[r.Method] = append(pauses[r.Method], r.PauseMS...)
		overlapped[r.Method] += r.Overlapped
		if r.BytesUploaded < 0 || m.BytesUploaded < 0 {
			m.BytesUploaded = -1 // a run without the remote: not measured
		} else {
			m.BytesUploaded += r.BytesUploaded
		}
		if r.CrashTurn > 0 && r.Err == "" {
			restores[r.Method] = append(restores[r.Method], r.RestoreMS)
		}
		if r.Method == Turnsnap {
			if !bad {
				equivN[r.Method]++
				if r.StateEquivalent != nil && *r.StateEquivalent {
					equiv[r.Method]++
				}
			}
			t := traces[r.Trace]
			if t == nil {
				t = &TraceSummary{Name: r.Trace, Mix: map[string]int{}}
				traces[r.Trace] = t
				order = append(order, r.Trace)
			}
			t.Crashes = append(t.Crashes, r.CrashTurn)
			if why, ok := invalid[[2]any{r.Trace, r.Seed}]; ok && t.Invalid == "" {
				t.Invalid = fmt.Sprintf("seed %d: %s", r.Seed, why)
			}
			if len(t.Crashes) == 1 { // one seed's classes: every seed replays the same turns
				for c, n := range r.Classes {
					t.Mix[c] += n
					t.Turns += n
				}
			}
		}
		if f := ff[[2]any{r.Trace, r.Seed}]; f != nil {
			for _, e := range r.ExposedMS {
				ckptSum[r.Method] += e
			}
			ffSum[r.Method] += f.WorkMS
			workSum[r.Method] += r.WorkMS
		}
	}
	for name, m := range s.Methods {
		if m.ValidRuns > 0 {
			v := float64(correct[name]) / float64(m.ValidRuns)
			m.RecoveryCorrectness = &v
		}
		if n := probeN[name]; n > 0 {
			v := float64(probeOK[name]) / float64(n)
			m.EndProbeMatch = &v
		}
		if n := equivN[name]; n > 0 {
			v := float64(equiv[name]) / float64(n)
			m.StateEquivalence = &v
		}
		if ffSum[name] > 0 {
			m.Overhead = ckptSum[name] / ffSum[name]
			m.WallOverhead = workSum[name]/ffSum[name] - 1
		}
		c := ckpts[name]
		m.CkptP50MS, m.CkptP95MS, m.CkptP99MS = Percentile(c, 50), Percentile(c, 95), Percentile(c, 99)
		e, p := exposed[name], pauses[name]
		m.ExposedP50MS, m.ExposedP99MS = Percentile(e, 50), Percentile(e, 99)
		m.Pauses, m.PauseP50MS, m.PauseP99MS = len(p), Percentile(p, 50), Percentile(p, 99)
		if len(c) > 0 {
			m.Overlapped = float64(overlapped[name]) / float64(len(c))
		}
		m.RestoreP50, m.RestoreMax = Percentile(restores[name], 50), Percentile(restores[name], 100)
	}
	for _, n := range order {
		t := traces[n]
		if t.Turns > 0 {
			t.Unchanged = float64(t.Mix["skip"]) / float64(t.Turns)
		}
		s.Traces = append(s.Traces, *t)
	}
	return s
}

// lastLine is the last non-empty line of a verifier's output, for a
// one-line reason.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if l == "" {
		return "(no output)"
	}
	if len(l) > 200 {
		l = l[:200] + "..."
	}
	return l
}

// Percentile is the nearest-rank percentile p (0..100) of v (0 if empty).
func Percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}
