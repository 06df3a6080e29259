package llmproxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's counters, registered on the registry the caller
// passes (the daemon's), never on the global one.
type metrics struct {
	requests     *prometheus.CounterVec   // by route: turn, passthrough, journal, unparsed
	gateWait     *prometheus.HistogramVec // exposed delay: reply ready → released, by gate
	gateOutcomes *prometheus.CounterVec   // by outcome: committed, failed, timeout, client_gone
	checkpoint   *prometheus.HistogramVec // checkpoint duration, by result: ok, error
	upstreamErrs prometheus.Counter
	journalErrs  *prometheus.CounterVec // by op: put, get
}

// gateBuckets span 100 us (a checkpoint that finished first) to ~50 s (the
// longest timeout anyone should configure).
var gateBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 14)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_llm_requests_total",
			Help: "Requests through the LLM proxy, by route: turn (closed a turn), passthrough (not a model call), journal (answered from the journal), unparsed (a model path whose body could not be read)."}, []string{"route"}),
		gateWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "turnsnap_llm_gate_wait_seconds",
			Help: "Delay the gate added to a model reply: from the reply being ready to its release.", Buckets: gateBuckets}, []string{"gate"}),
		gateOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_llm_gate_outcomes_total",
			Help: "How held replies were released: committed, failed (the checkpoint failed), timeout, client_gone."}, []string{"outcome"}),
		checkpoint: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "turnsnap_llm_checkpoint_seconds",
			Help: "Duration of checkpoints the proxy started, by result.", Buckets: gateBuckets}, []string{"result"}),
		upstreamErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_llm_upstream_errors_total",
			Help: "Model calls whose upstream could not be reached (answered 502)."}),
		journalErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_llm_journal_errors_total",
			Help: "Journal reads and writes that failed, by op."}, []string{"op"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.gateWait, m.gateOutcomes, m.checkpoint, m.upstreamErrs, m.journalErrs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
