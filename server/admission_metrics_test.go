package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnsnap/turnsnap/engine/admission"
)

type fixedAdmission admission.Stats

func (f fixedAdmission) Stats() admission.Stats { return admission.Stats(f) }

// The admission collector serves the scheduler's snapshot: queue depth by
// lane, and the waits as a histogram whose buckets are cumulative.
func TestAdmissionMetrics(t *testing.T) {
	st := admission.Stats{Slots: 2, Running: 2, Waiting: 5, UrgentWaiting: 1, Promoted: 3, Cancelled: 1, Yields: 4}
	st.Urgent.Count, st.Urgent.WaitSum = 3, 30*time.Millisecond
	st.Urgent.Buckets[0], st.Urgent.Buckets[3] = 1, 1 // 1 ms, 25 ms; one above 10 s
	reg := prometheus.NewRegistry()
	reg.MustRegister(newAdmissionCollector(fixedAdmission(st)))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			switch {
			case m.Gauge != nil:
				got[key] = ftoa(m.GetGauge().GetValue())
			case m.Counter != nil:
				got[key] = ftoa(m.GetCounter().GetValue())
			case m.Histogram != nil:
				var b []string
				for _, bk := range m.GetHistogram().GetBucket() {
					b = append(b, ftoa(float64(bk.GetCumulativeCount())))
				}
				got[key] = ftoa(float64(m.GetHistogram().GetSampleCount())) + " " + strings.Join(b[:5], ",")
			}
		}
	}
	want := map[string]string{
		"turnsnap_checkpoint_slots": "2", "turnsnap_checkpoint_running": "2",
		"turnsnap_checkpoint_queue_depth{normal}": "4", "turnsnap_checkpoint_queue_depth{urgent}": "1",
		"turnsnap_checkpoint_promotions_total": "3", "turnsnap_checkpoint_queue_cancelled_total": "1",
		"turnsnap_background_yields_total":               "4",
		"turnsnap_checkpoint_queue_wait_seconds{urgent}": "3 1,1,1,2,2",
		"turnsnap_checkpoint_queue_wait_seconds{normal}": "0 0,0,0,0,0",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
