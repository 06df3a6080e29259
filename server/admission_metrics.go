package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/engine/admission"
)

// admissionStats is what the admission collector needs of the scheduler.
type admissionStats interface {
	Stats() admission.Stats
}

// admissionCollector serves the engine's checkpoint admission scheduler
// (engine/admission) on /metrics, read at scrape time like the tracking
// counters: the engine keeps plain counters and needs no Prometheus.
type admissionCollector struct {
	e                                                        admissionStats
	slots, running, depth, wait, promoted, cancelled, yields *prometheus.Desc
}

func newAdmissionCollector(e admissionStats) prometheus.Collector {
	return &admissionCollector{e: e,
		slots: prometheus.NewDesc("turnsnap_checkpoint_slots",
			"Checkpoints that may run their heavy phases at once (0: no limit).", nil, nil),
		running: prometheus.NewDesc("turnsnap_checkpoint_running",
			"Checkpoints admitted and not done.", nil, nil),
		depth: prometheus.NewDesc("turnsnap_checkpoint_queue_depth",
			"Checkpoints waiting for a slot, by lane (urgent: a model reply waits for it).", []string{"lane"}, nil),
		wait: prometheus.NewDesc("turnsnap_checkpoint_queue_wait_seconds",
			"Time checkpoints waited for a slot, by the lane they were admitted in.", []string{"lane"}, nil),
		promoted: prometheus.NewDesc("turnsnap_checkpoint_promotions_total",
			"Waiting checkpoints moved to the urgent lane.", nil, nil),
		cancelled: prometheus.NewDesc("turnsnap_checkpoint_queue_cancelled_total",
			"Waiting checkpoints whose caller gave up before a slot was free.", nil, nil),
		yields: prometheus.NewDesc("turnsnap_background_yields_total",
			"Background tasks (frozen-layer freezes, pushes) that waited for urgent checkpoints.", nil, nil),
	}
}

func (c *admissionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.slots, c.running, c.depth, c.wait, c.promoted, c.cancelled, c.yields} {
		ch <- d
	}
}

func (c *admissionCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Stats()
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(st.Slots))
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(st.Running))
	ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(st.Waiting-st.UrgentWaiting), "normal")
	ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(st.UrgentWaiting), "urgent")
	for lane, l := range map[string]admission.Lane{"normal": st.Normal, "urgent": st.Urgent} {
		buckets := make(map[float64]uint64, len(admission.WaitBounds))
		var cum uint64
		for i, b := range admission.WaitBounds {
			cum += l.Buckets[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(c.wait, l.Count, l.WaitSum.Seconds(), buckets, lane)
	}
	ch <- prometheus.MustNewConstMetric(c.promoted, prometheus.CounterValue, float64(st.Promoted))
	ch <- prometheus.MustNewConstMetric(c.cancelled, prometheus.CounterValue, float64(st.Cancelled))
	ch <- prometheus.MustNewConstMetric(c.yields, prometheus.CounterValue, float64(st.Yields))
}
