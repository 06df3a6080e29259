package main

import (
	"context"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/internal/benchenv"
	"github.com/turnsnap/turnsnap/internal/modelserver"
	"github.com/turnsnap/turnsnap/internal/testenv"
)

// BenchmarkAgent is issue 26's closing figures, per real agent (Claude
// Code, Codex CLI, unmodified): the scripted session of TestAgent* (a
// failing test, a read, an edit, the test again, a build, a destructive
// mistake, a final answer: 7 model calls) runs twice in the same
// iteration, on the same project, against the same scripted model server:
// once straight against the model (no turnsnap), once under `turnsnap run`
// on a sandbox, through the daemon's LLM proxy (gate `local`: each reply
// waits for its checkpoint). Reported:
//
//   - calls/session and checkpoints/session (one per model call, plus the
//     final one that run takes after the agent exits);
//   - B/checkpoint: new bytes in the store per checkpoint (the committed
//     events' bytes_new: changed files and the model-call journal);
//   - the time the proxy adds per model call, as the agent sees it (see
//     callTap): direct_ms/call and proxy_ms/call are the median call
//     latencies, added_ms/call the median of the call-by-call differences
//     (call i through the proxy less call i direct: the same request at
//     the same point of the conversation), added_mean_ms/call their mean
//     (the session's total cost divided by its calls), proxy/direct_call
//     the ratio of the medians; added_fs_ms/call and added_skip_ms/call
//     split the differences by the call's checkpoint class (files changed
//     since the previous call, or none);
//   - gate_ms/call: of that, the mean time the gate held a ready reply for
//     its checkpoint (turnsnap_llm_gate_wait_seconds);
//   - session_proxy/direct: the sessions' wall times, start to exit (under
//     run: its set-up and final checkpoint included);
//   - load1: /proc/loadavg's 1-minute figure at the end of the iteration
//     (the machine is shared; read the milliseconds with it).
//
// The scripted model answers in under a millisecond, so the ratio of call
// latencies is large by construction: the milliseconds are what carries
// over to a real model, whose seconds of latency hide the checkpoint.
//
// Run: go test -tags turnsnaptest -run '^$' -bench BenchmarkAgent -benchtime 1x ./cmd/turnsnap/
func BenchmarkAgent(b *testing.B) {
	testenv.RequireRoot(b)
	for _, ag := range []struct {
		name string
		spec func(testing.TB) agentSpec
	}{{"claude-code", claudeCode}, {"codex", codex}} {
		b.Run(ag.name, func(b *testing.B) {
			a := ag.spec(b)
			var all []agentSessionPair
			for range b.N {
				all = append(all, benchAgentPair(b, a))
			}
			reportAgentPairs(b, all)
		})
	}
}

// agentSessionPair is one iteration's measurements.
type agentSessionPair struct {
	calls, checkpoints    int
	bytesNew              int64
	direct, proxy         []time.Duration // per model call, as the agent sees it
	directWall, runWall   time.Duration
	gateSum               float64 // seconds, over gateCount calls
	gateCount             int
	load1                 float64
	classes               []string // of each model call's checkpoint
	directFiles, runFiles map[string]string
}

// callTap is how the benchmark sees a call's latency from the agent's
// side without changing the agent: a reverse proxy in the test process
// that the agent's base URL points at, in both modes (forwarding to the
// model server direct, to the daemon's proxy under run). It times each
// model call from its request head's arrival to the last byte of its
// reply written back to the agent (streamed: flushed as it comes), so the
// agent's own work between calls (running its tools, node's start-up, its
// jitter under load) is outside the measure, unlike a gap between calls
// or a session's wall time. The tap's own hop is in both modes and cancels
// in the difference; what remains is the daemon's proxy: its hop, its
// request parsing and journal, and the gate's wait for the checkpoint.
type callTap struct {
	srv      *httptest.Server
	inflight sync.WaitGroup
	mu       sync.Mutex
	calls    []time.Duration
}

func newCallTap(b testing.TB, upstream string) *callTap {
	u, err := url.Parse(upstream)
	if err != nil {
		b.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u); r.Out.Host = u.Host },
		FlushInterval: -1,
		Transport:     &http.Transport{MaxIdleConnsPerHost: 4},
	}
	tp := &callTap{}
	tp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isModelCall(r) {
			rp.ServeHTTP(w, r)
			return
		}
		tp.inflight.Add(1)
		start := time.Now()
		// Deferred: ReverseProxy panics with http.ErrAbortHandler when the
		// agent hangs up before the stream's end (Codex does, once it has
		// read response.completed); the call is over for it then too.
		defer func() {
			d := time.Since(start)
			tp.mu.Lock()
			tp.calls = append(tp.calls, d)
			tp.mu.Unlock()
			tp.inflight.Done()
		}()
		rp.ServeHTTP(w, r)
	}))
	b.Cleanup(tp.srv.Close)
	return tp
}

// isModelCall is the proxy's turn rule for the two agents' APIs: a POST of
// Messages or Responses (not count_tokens).
func isModelCall(r *http.Request) bool {
	return r.Method == http.MethodPost && (strings.HasSuffix(r.URL.Path, "/messages") || strings.HasSuffix(r.URL.Path, "/responses"))
}

// latencies are the model calls' times in the order they ended, once
// none is in flight (a call's handler can outlive the agent's exit by a
// moment).
func (tp *callTap) latencies() []time.Duration {
	tp.inflight.Wait()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return slices.Clone(tp.calls)
}

// viaBase is a with its model base URL set to base inside its script, so
// that it holds under `turnsnap run` too (run sets the proxy's route in
// the environment; the tap forwards to that route, path and all).
func (a agentSpec) viaBase(base string) agentSpec {
	var exports []string
	for _, kv := range a.direct(base) {
		k, v, _ := strings.Cut(kv, "=")
		exports = append(exports, k+"="+shQuote(v))
	}
	a.script = "export " + strings.Join(exports, " ") + " && " + a.script
	return a
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func benchAgentPair(b *testing.B, a agentSpec) agentSessionPair {
	ctx := context.Background()
	ms := modelserver.New(nil)
	b.Cleanup(ms.Close)
	dir := b.TempDir()
	home, base, plain := filepath.Join(dir, "home"), filepath.Join(dir, "base"), filepath.Join(dir, "plain")
	writeProject(b, base)
	writeProject(b, plain)
	var p agentSessionPair

	// Straight against the model, through the tap only.
	dtap := newCallTap(b, ms.URL)
	da := a.viaBase(dtap.srv.URL + "/s/direct")
	ms.Script("direct", mainSteps(plain)...)
	direct := startAgent(b, da.directCmd(plain, dtap.srv.URL+"/s/direct", "fix the failing test"))()
	if direct.code != 0 {
		b.Fatalf("%s straight against the model:\n%s", a.name, direct)
	}
	p.directWall, p.direct = direct.wall, dtap.latencies()

	// Under turnsnap run, through the tap and the daemon's proxy.
	d := startDaemon(b, home, nil, "--llm-listen", "127.0.0.1:0", "--llm-upstream", ms.URL+"/s/proxy")
	c := d.client(b)
	cr, err := c.CreateSandbox(ctx, api.CreateRequest{Name: "s", Base: base})
	must(b, err)
	b.Cleanup(func() { c.RemoveSandbox(ctx, "s", false) }) // unmounts its root, before the daemon stops
	ms.Script("proxy", mainSteps(cr.Root)...)
	st, err := c.LLMStatus(ctx)
	must(b, err)
	ptap := newCallTap(b, st.URL)
	evs := subscribeEvents(b, home, "s")
	run := startAgent(b, a.viaBase(ptap.srv.URL+"/llm/s").runCmd(home, "s", "fix the failing test"))()
	evs.await(len(mainClasses))
	evs.stop()
	if run.code != 0 {
		b.Fatalf("%s under turnsnap run:\n%s\n%s", a.name, run, d.stderr.String())
	}
	p.runWall, p.proxy = run.wall, ptap.latencies()
	if metrics, err := c.Metrics(ctx); err == nil {
		p.gateSum = promValue(metrics, `turnsnap_llm_gate_wait_seconds_sum{gate="local"}`)
		p.gateCount = int(promValue(metrics, `turnsnap_llm_gate_wait_seconds_count{gate="local"}`))
	}

	// Honesty: both sessions ran the whole script and ended with the same
	// files; every model call reached the model through the tap; one
	// checkpoint per call with the session's classes, plus run's final.
	p.directFiles, p.runFiles = treeFiles(b, plain), treeFiles(b, cr.Root)
	if !maps.Equal(p.directFiles, p.runFiles) {
		b.Fatalf("%s: the sessions ended with different files:\ndirect %v\nthrough turnsnap run %v", a.name, p.directFiles, p.runFiles)
	}
	if p.directFiles["build/out.txt"] != "artifact\n" || p.directFiles["add.sh"] != "" || p.directFiles["notes/keep.txt"] != "" {
		b.Fatalf("%s: the session did not run as scripted: %v\n%s", a.name, p.directFiles, direct)
	}
	p.calls = ms.ModelCalls("proxy")
	if n := ms.ModelCalls("direct"); n != p.calls || n != len(mainClasses)-1 || len(p.direct) != n || len(p.proxy) != n {
		b.Fatalf("%s: model calls: direct %d (tap %d), through the proxy %d (tap %d), want %d each",
			a.name, n, len(p.direct), p.calls, len(p.proxy), len(mainClasses)-1)
	}
	commits, failed := evs.committed()
	if len(failed) > 0 || !reflect.DeepEqual(classes(commits), mainClasses) {
		b.Fatalf("%s: checkpoints %v, want one per model call and run's final: %v; failed %+v", a.name, classes(commits), mainClasses, failed)
	}
	p.checkpoints = len(commits)
	p.classes = classes(commits)[:p.calls]
	for _, ev := range commits {
		p.bytesNew += ev.BytesNew
	}
	p.load1 = benchenv.Load1(b)

	_, err = c.RemoveSandbox(ctx, "s", false)
	must(b, err)
	if code := d.stop(b); code != 0 {
		b.Fatalf("turnsnap serve exited %d", code)
	}
	return p
}

// treeFiles maps each path under root to its content, "<dir>" for a
// directory (keyed with a trailing slash) or "<mode>" for anything else; a
// missing file reads as "".
func treeFiles(b testing.TB, root string) map[string]string {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case e.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(data)
		case e.IsDir() && rel != ".":
			out[rel+"/"] = "<dir>"
		default:
			if rel != "." {
				out[rel] = "<" + e.Type().String() + ">"
			}
		}
		return nil
	})
	must(b, err)
	return out
}

func reportAgentPairs(b *testing.B, all []agentSessionPair) {
	var direct, proxy, added []time.Duration
	byClass := map[string][]time.Duration{}
	var calls, checkpoints, gateCount int
	var bytesNew int64
	var gateSum, load float64
	var directWall, runWall time.Duration
	for _, p := range all {
		for i := range p.direct {
			added = append(added, p.proxy[i]-p.direct[i])
			byClass[p.classes[i]] = append(byClass[p.classes[i]], p.proxy[i]-p.direct[i])
		}
		direct, proxy = append(direct, p.direct...), append(proxy, p.proxy...)
		calls, checkpoints, bytesNew = calls+p.calls, checkpoints+p.checkpoints, bytesNew+p.bytesNew
		gateSum, gateCount, load = gateSum+p.gateSum, gateCount+p.gateCount, max(load, p.load1)
		directWall, runWall = directWall+p.directWall, runWall+p.runWall
	}
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var sum time.Duration
	for _, d := range added {
		sum += d
	}
	n := float64(len(all))
	b.ReportMetric(float64(calls)/n, "calls/session")
	b.ReportMetric(float64(checkpoints)/n, "checkpoints/session")
	b.ReportMetric(float64(bytesNew)/float64(checkpoints), "B/checkpoint")
	b.ReportMetric(msOf(median(direct)), "direct_ms/call")
	b.ReportMetric(msOf(median(proxy)), "proxy_ms/call")
	b.ReportMetric(msOf(median(added)), "added_ms/call")
	b.ReportMetric(msOf(sum/time.Duration(len(added))), "added_mean_ms/call")
	for _, class := range []string{"fs", "skip"} {
		if len(byClass[class]) > 0 {
			b.ReportMetric(msOf(median(byClass[class])), "added_"+class+"_ms/call")
		}
	}
	b.ReportMetric(float64(median(proxy))/float64(median(direct)), "proxy/direct_call")
	if gateCount > 0 {
		b.ReportMetric(gateSum/float64(gateCount)*1000, "gate_ms/call")
	}
	b.ReportMetric(float64(runWall)/float64(directWall), "session_proxy/direct")
	b.ReportMetric(load, "load1")
	b.Logf("per call, direct %v; through the proxy %v; added %v", roundAll(direct), roundAll(proxy), roundAll(added))
	b.Logf("sessions: direct %s, through turnsnap run %s; %d bytes new in %d checkpoints",
		(directWall / time.Duration(len(all))).Round(time.Millisecond), (runWall / time.Duration(len(all))).Round(time.Millisecond), bytesNew, checkpoints)
}
