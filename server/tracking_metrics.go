package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/engine"
)

// trackingStats is what the tracking collector needs of the engine.
type trackingStats interface {
	TrackingStats() engine.TrackingStats
}

// trackingCollector serves the engine's change-tracking counters
// (engine.TrackingStats) on /metrics. The engine keeps plain counters;
// this reads them at scrape time, so the engine needs no Prometheus.
type trackingCollector struct {
	e                               trackingStats
	overflows, events, walks, scans *prometheus.Desc
}

// NewTrackingCollector returns the collector of e's change tracking:
// turnsnap_change_event_overflows_total, turnsnap_change_events_total,
// turnsnap_walk_fallbacks_total{reason} and
// turnsnap_tracked_scans_total{how} (unchanged: nothing read; changed:
// only the paths the events named).
func NewTrackingCollector(e trackingStats) prometheus.Collector {
	return &trackingCollector{e: e,
		overflows: prometheus.NewDesc("turnsnap_change_event_overflows_total",
			"Kernel change-event queue overflows (each makes the sandbox's next turn walk).", nil, nil),
		events: prometheus.NewDesc("turnsnap_change_events_total",
			"Change events read from the sandboxes' fanotify groups.", nil, nil),
		walks: prometheus.NewDesc("turnsnap_walk_fallbacks_total",
			"Turns that walked the writable layer instead of reading the change record, by reason.", []string{"reason"}, nil),
		scans: prometheus.NewDesc("turnsnap_tracked_scans_total",
			"Turns decided from the change record without a walk.", []string{"how"}, nil),
	}
}

func (c *trackingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.overflows
	ch <- c.events
	ch <- c.walks
	ch <- c.scans
}

func (c *trackingCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.TrackingStats()
	ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(st.Overflows))
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(st.Events))
	for reason, n := range st.Walks {
		ch <- prometheus.MustNewConstMetric(c.walks, prometheus.CounterValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.scans, prometheus.CounterValue, float64(st.UnchangedTurns), "unchanged")
	ch <- prometheus.MustNewConstMetric(c.scans, prometheus.CounterValue, float64(st.TrackedScans-st.UnchangedTurns), "changed")
}
