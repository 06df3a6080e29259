// Package report writes a benchmark's result: result.json (every run and
// the summary), REPORT.md (the headline tables) and hand-written SVG
// plots, all into one directory.
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/turnsnap/turnsnap/bench/harness"
	"github.com/turnsnap/turnsnap/engine/audit"
)

// Files are the names Write always creates in its directory; it adds
// audit-TRACE.html for each trace whose turnsnap run was audited.
var Files = []string{"result.json", "REPORT.md", "latency_cdf.svg", "class_mix.svg", "overhead_vs_n.svg", "bytes_per_method.svg"}

// Write writes every file of the report into dir.
func Write(dir string, res *harness.Result, sum *harness.Summary) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(struct {
		Summary *harness.Summary `json:"summary"`
		Result  *harness.Result  `json:"result"`
	}{sum, res}, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"result.json":          append(b, '\n'),
		"REPORT.md":            []byte(Markdown(sum)),
		"latency_cdf.svg":      []byte(latencyCDF(res)),
		"class_mix.svg":        []byte(classMix(sum)),
		"overhead_vs_n.svg":    []byte(overheadVsN(sum)),
		"bytes_per_method.svg": []byte(bytesPerMethod(sum)),
	}
	for _, r := range res.Runs {
		if r.Audit != nil {
			var buf bytes.Buffer
			if err := audit.WriteHTML(&buf, r.Trace, r.Audit); err != nil {
				return err
			}
			files["audit-"+r.Trace+".html"] = buf.Bytes()
		}
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", v*100) }

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// Markdown is REPORT.md.
func Markdown(s *harness.Summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# turnsnap bench report\n\n")
	fmt.Fprintf(&b, "%d CPUs, kernel %s, %s; load average before %v, after %v, 1-minute load during the run mean %.2f, max %.2f; %.0f s in all.\n\n",
		s.Host.CPUs, s.Host.KernelLabel, s.Host.GoVersion, s.Host.LoadBefore, s.Host.LoadAfter, s.Host.Load1Mean, s.Host.Load1Max, s.Seconds)
	remote := fmt.Sprintf("a MinIO remote on 127.0.0.1, uploaded to by the daemon's background pusher during the runs (the traces' bases, %s, went up before them)", mib(s.BaseBytesUploaded))
	if !s.Remote {
		remote = "no remote (bytes uploaded not measured)"
	}
	fmt.Fprintf(&b, "Model latencies at %.2fx the traces' declared values; every checkpoint runs during its turn's model latency and the next turn waits for it to commit (the gate); %s.\n\n", s.LatencyScale, remote)
	if len(s.Methods) == 0 {
		fmt.Fprintf(&b, "Co-location series only (--colocation-only): no crash runs.\n\n")
	}
	if len(s.Invalid) > 0 {
		// Before the tables, so that no reader takes a figure for a
		// trace that measured nothing.
		fmt.Fprintf(&b, "## INVALID traces\n\nTheir fault-free run did not pass its verifier, so they measure nothing about recovery: their runs count in no recovery correctness or state equivalence figure below.\n\n")
		for _, v := range s.Invalid {
			fmt.Fprintf(&b, "- INVALID: trace %s seed %d: %s\n", v.Trace, v.Seed, strings.ReplaceAll(v.Reason, "\n", " "))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "## Methods\n\n")
	fmt.Fprintf(&b, "| method | runs | recovery correctness | state equivalence | overhead | wall overhead | gate delay p50 / p99 | bytes stored | bytes uploaded | ckpt p50 | ckpt p95 | ckpt p99 | pauses, p50 / p99 | restore p50 |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range harness.Methods {
		ms := s.Methods[m]
		if ms == nil {
			continue
		}
		corr, eq := "INVALID (no valid trace)", "-"
		if ms.RecoveryCorrectness != nil {
			corr = fmt.Sprintf("%s of %d", pct(*ms.RecoveryCorrectness), ms.ValidRuns)
		}
		if ms.StateEquivalence != nil {
			eq = pct(*ms.StateEquivalence)
		}
		up := "-"
		if ms.BytesUploaded >= 0 && s.Remote && (m == harness.Turnsnap || m == harness.ChatFS) {
			up = mib(ms.BytesUploaded)
		}
		pause := "-"
		if ms.Pauses > 0 {
			pause = fmt.Sprintf("%d, %.1f / %.1f ms", ms.Pauses, ms.PauseP50MS, ms.PauseP99MS)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %.1f / %.1f ms | %s | %s | %.1f ms | %.1f ms | %.1f ms | %s | %.0f ms |\n", m, ms.Runs,
			corr, eq, pct(ms.Overhead), pct(ms.WallOverhead), ms.ExposedP50MS, ms.ExposedP99MS,
			mib(ms.BytesStored), up, ms.CkptP50MS, ms.CkptP95MS, ms.CkptP99MS, pause, ms.RestoreP50)
	}
	var probes []string
	for _, m := range harness.Methods {
		if ms := s.Methods[m]; ms != nil && ms.EndProbeMatch != nil {
			probes = append(probes, fmt.Sprintf("%s %s", m, pct(*ms.EndProbeMatch)))
		}
	}
	if len(probes) > 0 {
		fmt.Fprintf(&b, "\nEnd probe (traces that declare one): the runs whose probe after the last turn answered as the fault-free run's did: %s.\n", strings.Join(probes, ", "))
	}
	ts, full := s.Methods[harness.Turnsnap], s.Methods[harness.FullPerTurn]
	if ts != nil && full != nil && full.BytesStored > 0 {
		fmt.Fprintf(&b, "\nturnsnap stores %s of full_per_turn's bytes", pct(float64(ts.BytesStored)/float64(full.BytesStored)))
		if ts.CkptP50MS > 0 {
			fmt.Fprintf(&b, "; full_per_turn's median checkpoint takes %.2fx turnsnap's", full.CkptP50MS/ts.CkptP50MS)
		}
		if ts.Overhead > 0 && full.Overhead > 0 {
			fmt.Fprintf(&b, "; its gate delays add %.2fx turnsnap's", full.Overhead/ts.Overhead)
		}
		b.WriteString(".\n")
	}
	fmt.Fprintf(&b, "\nOverhead: the gate's delays beyond the model latency (what the checkpoints added to the agent's time), over the fault-free replays' time. Wall overhead: the replays' whole time (crash and recovery left out) against fault-free's; it also holds the checkpoints' cost to the turns' own commands and the commands' noise. Gate delay: per checkpoint. Pauses: checkpoints that froze the processes and for how long (turnsnap: from its records). fault_free and chat_only take no checkpoints; chat_fs checkpoints through turnsnap and restores files only.\n")
	fmt.Fprintf(&b, "\n## Traces (turn mix measured by turnsnap)\n\n| trace | turns | skip | fs | process | full | unchanged | crash turns |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range s.Traces {
		name := t.Name
		if t.Invalid != "" {
			name += " (INVALID)"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s | %v |\n", name, t.Turns, t.Mix["skip"], t.Mix["fs"], t.Mix["process"], t.Mix["full"], pct(t.Unchanged), t.Crashes)
	}
	if len(s.Colocate) > 0 {
		fmt.Fprintf(&b, "\n## Co-location (N sandboxes at once, no crash)\n\n| N |")
		for _, m := range harness.ColoMethods {
			fmt.Fprintf(&b, " %s wall |", m)
		}
		for _, m := range harness.ColoMethods[1:] {
			fmt.Fprintf(&b, " %s slowdown | %s gate p50 / p99 |", m, m)
		}
		if s.Remote {
			b.WriteString(" turnsnap uploaded |")
		}
		cols := 1 + len(harness.ColoMethods) + 2*(len(harness.ColoMethods)-1)
		if s.Remote {
			cols++
		}
		fmt.Fprintf(&b, "\n|%s\n", strings.Repeat("---|", cols))
		for _, c := range s.Colocate {
			fmt.Fprintf(&b, "| %d |", c.N)
			for _, m := range harness.ColoMethods {
				fmt.Fprintf(&b, " %.1f s |", c.WallMS[m]/1000)
			}
			for _, m := range harness.ColoMethods[1:] {
				fmt.Fprintf(&b, " %s | %.0f / %.0f ms |", pct(c.Slowdown[m]), c.ExposedP50MS[m], c.ExposedP99MS[m])
			}
			if s.Remote {
				fmt.Fprintf(&b, " %s |", mib(c.BytesUploaded[harness.Turnsnap]))
			}
			b.WriteString("\n")
		}
		sep := "\n" // the errors follow the table: a line inside would end it
		for _, c := range s.Colocate {
			for _, e := range c.Errors {
				fmt.Fprintf(&b, "%s- N=%d: %s\n", sep, c.N, e)
				sep = ""
			}
		}
		b.WriteString("\nBatches ran in the order")
		for i, c := range s.Colocate {
			sep := ";"
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&b, "%s N=%d %s", sep, c.N, strings.Join(c.Order, ", "))
		}
		b.WriteString(" (rotated, so that no method always runs first). Slowdown: the batch's wall time (its start to its last verifier) over fault_free's, minus one; gate: the delays beyond the model latency over every checkpoint of the batch.\n")
	}
	if len(s.Errors) > 0 {
		fmt.Fprintf(&b, "\n## Errors\n\n")
		for _, e := range s.Errors {
			fmt.Fprintf(&b, "- %s\n", e)
		}
	}
	fmt.Fprintf(&b, "\nPlots: latency_cdf.svg, class_mix.svg, overhead_vs_n.svg, bytes_per_method.svg. Every run: result.json. Per-turn audits of each trace's turnsnap sandbox (first seed): audit-TRACE.html.\n")
	return b.String()
}

var colors = map[string]string{harness.Turnsnap: "#1f77b4", harness.FullPerTurn: "#d62728", harness.ChatFS: "#2ca02c",
	harness.ChatOnly: "#9467bd", harness.FaultFree: "#7f7f7f", "skip": "#c7c7c7", "fs": "#1f77b4", "process": "#ff7f0e", "full": "#d62728"}

type svg struct{ strings.Builder }

func newSVG(w, h int, title string) *svg {
	s := &svg{}
	fmt.Fprintf(s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(s, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="18" text-anchor="middle" font-size="14">%s</text>`+"\n", w/2, esc(title))
	return s
}

func (s *svg) end() string { s.WriteString("</svg>\n"); return s.String() }

func esc(t string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(t)
}

// latencyCDF plots each checkpointing method's checkpoint latencies
// (solid) and the gate's delays beyond the model latency (dashed; a zero
// delay sits at the left edge).
func latencyCDF(res *harness.Result) string {
	const W, H, L, R, T, B = 640, 360, 60, 160, 30, 40
	s := newSVG(W, H, "CDF: checkpoint latency (solid), gate delay (dashed); ms, log scale")
	lat, gate := map[string][]float64{}, map[string][]float64{}
	for _, r := range res.Runs {
		lat[r.Method] = append(lat[r.Method], r.CkptMS...)
		gate[r.Method] = append(gate[r.Method], r.ExposedMS...)
	}
	lo, hi := 0.1, 1.0
	for _, v := range lat {
		for _, x := range v {
			hi = max(hi, x)
		}
	}
	lx := func(v float64) float64 {
		v = max(v, lo)
		return L + (W-L-R)*(log10(v)-log10(lo))/(log10(hi)-log10(lo))
	}
	fmt.Fprintf(&s.Builder, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", L, H-B, W-R, H-B, L, T, L, H-B)
	for d := lo; d <= hi*10; d *= 10 {
		if d > hi {
			break
		}
		fmt.Fprintf(&s.Builder, `<text x="%.0f" y="%d" text-anchor="middle">%g</text>`+"\n", lx(d), H-B+15, d)
	}
	for _, q := range []float64{0, 0.5, 1} {
		fmt.Fprintf(&s.Builder, `<text x="%d" y="%.0f" text-anchor="end">%.0f%%</text>`+"\n", L-5, float64(H-B)-q*float64(H-B-T)+4, q*100)
	}
	row := 0
	for _, m := range harness.Methods {
		for _, series := range []struct {
			v    []float64
			dash string
			name string
		}{{lat[m], "", m}, {gate[m], ` stroke-dasharray="5,3"`, m + " gate"}} {
			v := append([]float64(nil), series.v...)
			if len(v) == 0 {
				continue
			}
			sort.Float64s(v)
			var pts []string
			for i, x := range v {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", lx(x), float64(H-B)-float64(i+1)/float64(len(v))*float64(H-B-T)))
			}
			fmt.Fprintf(&s.Builder, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", colors[m], series.dash, strings.Join(pts, " "))
			fmt.Fprintf(&s.Builder, `<text x="%d" y="%d" fill="%s">%s (%d)</text>`+"\n", W-R+10, T+20+row*18, colors[m], series.name, len(v))
			row++
		}
	}
	return s.end()
}

func log10(v float64) float64 { return math.Log10(v) }

// classMix is one stacked bar per trace.
func classMix(sum *harness.Summary) string {
	const W, L, R, BarH = 640, 90, 120, 22
	H := 60 + len(sum.Traces)*(BarH+8)
	s := newSVG(W, H, "turn class mix per trace (turnsnap)")
	classes := []string{"skip", "fs", "process", "full"}
	for i, t := range sum.Traces {
		y := 35 + i*(BarH+8)
		fmt.Fprintf(&s.Builder, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", L-5, y+15, esc(t.Name))
		x := float64(L)
		for _, c := range classes {
			if t.Turns == 0 || t.Mix[c] == 0 {
				continue
			}
			w := float64(W-L-R) * float64(t.Mix[c]) / float64(t.Turns)
			fmt.Fprintf(&s.Builder, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %d</title></rect>`+"\n", x, y, w, BarH, colors[c], c, t.Mix[c])
			x += w
		}
	}
	for i, c := range classes {
		fmt.Fprintf(&s.Builder, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", W-R+10, 35+i*18, colors[c], W-R+26, 46+i*18, c)
	}
	return s.end()
}

// bars draws one horizontal bar per label.
func bars(title string, labels []string, vals []float64, unit func(float64) string) string {
	const W, L, R, BarH = 640, 110, 130, 22
	H := 50 + len(labels)*(BarH+8)
	s := newSVG(W, H, title)
	top := 0.0
	for _, v := range vals {
		top = max(top, v)
	}
	for i, l := range labels {
		y := 35 + i*(BarH+8)
		w := 0.0
		if top > 0 {
			w = float64(W-L-R) * vals[i] / top
		}
		fmt.Fprintf(&s.Builder, `<text x="%d" y="%d" text-anchor="end">%s</text><rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/><text x="%.1f" y="%d">%s</text>`+"\n",
			L-5, y+15, esc(l), L, y, w, BarH, colorOf(l), float64(L)+w+5, y+15, unit(vals[i]))
	}
	return s.end()
}

func colorOf(l string) string {
	for k, c := range colors {
		if strings.HasPrefix(l, k) {
			return c
		}
	}
	return "#1f77b4"
}

func bytesPerMethod(sum *harness.Summary) string {
	var labels []string
	var vals []float64
	for _, m := range harness.Methods {
		if ms := sum.Methods[m]; ms != nil {
			labels, vals = append(labels, m), append(vals, float64(ms.BytesStored))
		}
	}
	return bars("bytes stored per method (all runs)", labels, vals, func(v float64) string { return mib(int64(v)) })
}

func overheadVsN(sum *harness.Summary) string {
	var labels []string
	var vals []float64
	for _, c := range sum.Colocate {
		for _, m := range harness.ColoMethods[1:] {
			labels, vals = append(labels, fmt.Sprintf("%s N=%d", m, c.N)), append(vals, max(c.Slowdown[m], 0))
		}
	}
	if len(labels) == 0 {
		for _, m := range harness.Methods {
			if ms := sum.Methods[m]; ms != nil && m != harness.FaultFree && m != harness.ChatOnly {
				labels, vals = append(labels, m+" N=1"), append(vals, ms.Overhead)
			}
		}
	}
	return bars("slowdown against fault_free at N co-located sandboxes", labels, vals, pct)
}
