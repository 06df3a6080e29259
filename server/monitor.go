package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload/sched"
)

// DefaultEventRing is how many recent events the monitor keeps for
// clients that reconnect with Last-Event-ID (SetRing; serve --event-ring):
// events are small, and a client away for more than this many gets a gap
// event.
const DefaultEventRing = 4096

// Monitor turns what the service does into events, metrics and log lines.
// A nil *Monitor does nothing (the CLI's direct mode).
type Monitor struct {
	log *slog.Logger
	reg *prometheus.Registry

	mu   sync.Mutex
	run  string // this run's id, the first half of every event's ID
	seq  uint64
	subs map[chan api.Event]struct{}
	// ring holds the last ringCap events, ring[(seq-1)%ringCap] the one
	// numbered seq.
	ring    []api.Event
	ringCap uint64

	turns       *prometheus.CounterVec
	turnSeconds prometheus.Histogram
	phases      *prometheus.HistogramVec
	pause       prometheus.Histogram
	criuFrozen  prometheus.Histogram
	bytesRead   prometheus.Counter
	bytesNew    prometheus.Counter
	uploaded    prometheus.Counter
	sent        prometheus.Counter
	uploads     prometheus.Counter
	upFailed    prometheus.Counter
	pushes      *prometheus.CounterVec
	pushing     prometheus.Gauge
	rate        prometheus.Gauge
	restores    *prometheus.CounterVec
	restoreSecs *prometheus.HistogramVec
	errs        *prometheus.CounterVec
	dropped     prometheus.Counter
	forgotten   prometheus.Counter
}

// subBuffer is how many events a slow /v1/events reader may lag behind
// before it misses some (counted in turnsnap_events_dropped_total): a
// subscriber must never slow a turn down.
const subBuffer = 1024

// NewMonitor makes a monitor with its own registry; extra collectors (the
// change tracker's counters, say) are registered with it too.
func NewMonitor(log *slog.Logger, e *engine.Engine, extra ...prometheus.Collector) (*Monitor, error) {
	m := &Monitor{log: log, reg: prometheus.NewRegistry(), subs: map[chan api.Event]struct{}{},
		run: strconv.FormatInt(time.Now().UnixNano(), 36), ringCap: DefaultEventRing}
	// Buckets from 100µs (a skip) to about a minute (a big dump).
	buckets := prometheus.ExponentialBuckets(0.0001, 2.5, 14)
	m.turns = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_turns_total", Help: "Closed turns by class (skip, fs, process, full)."}, []string{"class"})
	m.turnSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "turnsnap_checkpoint_seconds", Help: "Checkpoint latency, end to end in the engine.", Buckets: buckets})
	m.phases = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "turnsnap_checkpoint_phase_seconds", Help: "Checkpoint latency by phase (freeze, scan, dump, store, commit).", Buckets: buckets}, []string{"phase"})
	m.pause = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "turnsnap_pause_seconds", Help: "How long a turn kept the sandbox's processes frozen (turns that paused them).", Buckets: buckets})
	m.criuFrozen = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "turnsnap_criu_frozen_seconds", Help: "CRIU's own frozen_time of each process dump (its stats-dump), the part of a pause spent inside CRIU.", Buckets: buckets})
	m.bytesRead = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_checkpoint_bytes_read_total", Help: "File bytes read by checkpoint scans."})
	m.bytesNew = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_checkpoint_bytes_stored_total", Help: "Bytes of new objects checkpoints wrote to the local store."})
	m.uploaded = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_upload_bytes_total", Help: "Bytes of objects uploaded to the remote store (successful PUTs)."})
	m.sent = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_upload_sent_bytes_total", Help: "Body bytes sent to the remote store, resent and failed ones included."})
	m.uploads = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_uploads_total", Help: "Objects uploaded to the remote store."})
	m.upFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_upload_failures_total", Help: "Uploads that failed (each is retried by a later push)."})
	m.pushes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_pushes_total", Help: "Pushes of the upload queue by outcome (ok, error)."}, []string{"outcome"})
	m.pushing = prometheus.NewGauge(prometheus.GaugeOpts{Name: "turnsnap_push_running", Help: "1 while a push of the upload queue runs."})
	m.rate = prometheus.NewGauge(prometheus.GaugeOpts{Name: "turnsnap_upload_rate_bytes_per_second", Help: "Upload rate of the last push."})
	m.restores = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_restores_total", Help: "Restores by kind (rollback, branch) and outcome."}, []string{"kind", "outcome"})
	m.restoreSecs = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "turnsnap_restore_seconds", Help: "Restore latency by kind.", Buckets: buckets}, []string{"kind"})
	m.errs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "turnsnap_errors_total", Help: "Failed API requests by error class."}, []string{"class"})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_events_dropped_total", Help: "Events a slow /v1/events reader missed."})
	m.forgotten = prometheus.NewCounter(prometheus.CounterOpts{Name: "turnsnap_forgotten_checkpoints_total", Help: "Checkpoints deleted by retention policies (forget, policy apply, the --forget-interval schedule)."})
	cs := []prometheus.Collector{m.turns, m.turnSeconds, m.phases, m.pause, m.criuFrozen, m.bytesRead, m.bytesNew, m.uploaded, m.sent,
		m.uploads, m.upFailed, m.pushes, m.pushing, m.rate, m.restores, m.restoreSecs, m.errs, m.dropped, m.forgotten,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
	if e != nil {
		cs = append(cs, queueCollector{e}, newAdmissionCollector(e.Admission()))
	}
	for _, c := range append(cs, extra...) {
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetRing sets how many recent events are kept for resuming clients (at
// least 1). Call it before the first event.
func (m *Monitor) SetRing(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ringCap = uint64(max(n, 1))
}

// Registry is what /metrics serves.
func (m *Monitor) Registry() *prometheus.Registry { return m.reg }

// queueCollector reads the upload queue at scrape time (catalog only).
type queueCollector struct{ e *engine.Engine }

var (
	queueDepthDesc = prometheus.NewDesc("turnsnap_upload_queue_depth", "Objects waiting for the remote store.", nil, nil)
	queueBytesDesc = prometheus.NewDesc("turnsnap_upload_queue_bytes", "Bytes waiting for the remote store.", nil, nil)
)

func (q queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueDepthDesc
	ch <- queueBytesDesc
}

func (q queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The queue's totals alone: Status would read the whole history at
	// every scrape.
	objects, bytes, err := q.e.HomeSetup().QueueTotals(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(objects))
	ch <- prometheus.MustNewConstMetric(queueBytesDesc, prometheus.GaugeValue, float64(bytes))
}

// Subscribe returns a channel of events from now on; cancel ends it.
func (m *Monitor) Subscribe() (<-chan api.Event, func()) {
	_, ch, cancel := m.SubscribeAfter("")
	return ch, cancel
}

// SubscribeAfter is Subscribe for a client resuming after the event whose
// ID is last ("" for a new client): it also returns the events it missed
// that the ring still has, led by a gap event when some are gone (older
// than the ring, or of an earlier run), so the backlog and the channel
// together have every event after last, each once. A last that is not an
// event ID at all is ErrInvalid.
func (m *Monitor) SubscribeAfter(last string) ([]api.Event, <-chan api.Event, func()) {
	ch := make(chan api.Event, subBuffer)
	m.mu.Lock()
	backlog := m.missed(last)
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	return backlog, ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.subs[ch]; ok {
			delete(m.subs, ch)
			close(ch)
		}
	}
}

// missed lists the events after ID last (see SubscribeAfter); m.mu held.
func (m *Monitor) missed(last string) []api.Event {
	if last == "" {
		return nil
	}
	oldest := m.seq - uint64(len(m.ring)) + 1 // the ring's first seq
	run, seqStr, _ := strings.Cut(last, ":")
	after, err := strconv.ParseUint(seqStr, 10, 64)
	var out []api.Event
	switch {
	case err != nil || run != m.run || after > m.seq:
		// Another run's id: its events are gone, this run's are all
		// after it.
		out = append(out, m.gapEvent(0, oldest))
		after = oldest - 1
	case after+1 < oldest:
		out = append(out, m.gapEvent(after, oldest))
		after = oldest - 1
	}
	for seq := after + 1; seq <= m.seq; seq++ {
		out = append(out, m.ring[(seq-1)%m.ringCap])
	}
	return out
}

// since is missed for this run's event seq: the events after it the ring
// has, led by a gap event for those it lost.
func (m *Monitor) since(seq uint64) []api.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.missed(fmt.Sprintf("%s:%d", m.run, seq))
}

// gapEvent stands for the events between after and before (exclusive).
// It carries no seq of its own: it is not in the ring.
func (m *Monitor) gapEvent(after, before uint64) api.Event {
	return api.Event{Type: api.EventGap, After: after, Before: before, Time: time.Now().UTC(),
		ID: fmt.Sprintf("%s:%d", m.run, before-1)}
}

// CloseSubscribers ends every event stream (the daemon is shutting down).
func (m *Monitor) CloseSubscribers() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ch := range m.subs {
		delete(m.subs, ch)
		close(ch)
	}
}

func (m *Monitor) publish(ev api.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	ev.Seq, ev.Time = m.seq, time.Now().UTC()
	ev.ID = fmt.Sprintf("%s:%d", m.run, ev.Seq)
	if uint64(len(m.ring)) < m.ringCap {
		m.ring = append(m.ring, ev)
	} else {
		m.ring[(ev.Seq-1)%m.ringCap] = ev
	}
	for ch := range m.subs {
		select {
		case ch <- ev:
		default:
			m.dropped.Inc()
		}
	}
}

func (m *Monitor) started(sandbox string) {
	if m == nil {
		return
	}
	m.publish(api.Event{Type: api.EventStarted, Sandbox: sandbox})
}

func (m *Monitor) checkpointed(sandbox string, r *engine.CheckpointResult, err error, d time.Duration) {
	if m == nil {
		return
	}
	if err != nil {
		class := errdefs.Class(err)
		m.errs.WithLabelValues(class).Inc()
		m.log.Warn("turn failed", "sandbox", sandbox, "class", class, "err", err)
		m.publish(api.Event{Type: api.EventFailed, Sandbox: sandbox, ErrorClass: class, Error: err.Error(), DurationMS: ms(d)})
		return
	}
	m.turns.WithLabelValues(string(r.Class)).Inc()
	m.turnSeconds.Observe(r.Duration.Seconds())
	phases := phasesMS(r.Phases)
	for name, p := range phases {
		m.phases.WithLabelValues(name).Observe(p / 1000)
	}
	if r.Stats.PauseNs > 0 {
		m.pause.Observe(time.Duration(r.Stats.PauseNs).Seconds())
	}
	if r.ProcDump != nil {
		m.criuFrozen.Observe(time.Duration(r.ProcDump.FrozenNs).Seconds())
	}
	m.bytesRead.Add(float64(r.Stats.BytesRead))
	m.bytesNew.Add(float64(r.Stats.BytesNew))
	m.log.Info("turn closed", "sandbox", sandbox, "checkpoint", r.ID.Short(), "class", r.Class, "turn", r.Turn,
		"bytes_new", r.Stats.BytesNew, "duration", r.Duration)
	m.publish(api.Event{Type: api.EventCommitted, Sandbox: sandbox, Checkpoint: r.ID.String(), Class: string(r.Class),
		BytesNew: r.Stats.BytesNew, DurationMS: ms(r.Duration), PhasesMS: phases})
}

// restored counts a rollback or branch and publishes its event, with its
// receipt (r may be nil: a restore that failed before it made anything).
func (m *Monitor) restored(kind, sandbox string, r *engine.RestoreResult, err error, d time.Duration) {
	if m == nil {
		return
	}
	outcome := "ok"
	ev := api.Event{Type: kind, Sandbox: sandbox, DurationMS: ms(d)}
	if r != nil {
		ev.Checkpoint, ev.Receipt = r.Checkpoint.ID.String(), receiptOf(r.Receipt)
	}
	if err != nil {
		outcome = "error"
		ev.ErrorClass, ev.Error = errdefs.Class(err), err.Error()
		m.errs.WithLabelValues(ev.ErrorClass).Inc()
		var ri *engine.RestoreIncompleteError
		if errors.As(err, &ri) {
			ev.Checkpoint, ev.Receipt = ri.Receipt.Checkpoint.String(), receiptOf(ri.Receipt)
		}
	}
	m.restores.WithLabelValues(kind, outcome).Inc()
	m.restoreSecs.WithLabelValues(kind).Observe(d.Seconds())
	m.publish(ev)
}

// changed publishes a state change other than a turn or a restore.
func (m *Monitor) changed(ev api.Event) {
	if m != nil {
		m.publish(ev)
	}
}

// requestFailed counts an API request that failed (other than a turn,
// which checkpointed counts).
func (m *Monitor) requestFailed(err error) {
	if m == nil {
		return
	}
	m.errs.WithLabelValues(errdefs.Class(err)).Inc()
}

// pushStarted marks a push running.
func (m *Monitor) pushStarted() {
	if m != nil {
		m.pushing.Set(1)
	}
}

// pushed records one push of the upload queue: its report, error and the
// scheduler's final counters.
func (m *Monitor) pushed(r *engine.PushReport, err error, st sched.Stats) {
	if m == nil {
		return
	}
	m.pushing.Set(0)
	outcome := "ok"
	if err != nil {
		outcome = "error"
		m.errs.WithLabelValues(errdefs.Class(err)).Inc()
	}
	m.pushes.WithLabelValues(outcome).Inc()
	m.sent.Add(float64(st.SentBytes))
	m.upFailed.Add(float64(st.Failed))
	if r != nil {
		m.uploaded.Add(float64(r.Bytes))
		m.uploads.Add(float64(r.Uploaded))
		if r.Duration > 0 && r.Bytes > 0 {
			m.rate.Set(float64(r.Bytes) / r.Duration.Seconds())
		}
	}
}

func (m *Monitor) remoteDurable(sandbox string, id delta.ID) {
	if m == nil {
		return
	}
	m.log.Info("checkpoint remotely durable", "sandbox", sandbox, "checkpoint", id.Short())
	m.publish(api.Event{Type: api.EventRemoteDurable, Sandbox: sandbox, Checkpoint: id.String()})
}
