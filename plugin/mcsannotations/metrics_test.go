package mcsannotations

import (
	"strings"
	"testing"

	coretest "github.com/coredns/coredns/test"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// series returns the value of every sample of the named metric family in the
// default registry, keyed by its label values joined with ",". For a
// histogram the value is its sample count.
func series(t *testing.T, name string) map[string]float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetValue()
			}
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	default:
		return m.Gauge.GetValue()
	}
}

// Every labelled series an alert or dashboard reads exists, at 0, as soon as
// the plugin starts: a counter's first event then shows as an increase
// instead of as the series' first sample. Here no API server answers, so no
// event happens.
func TestSeriesRegisteredAtStart(t *testing.T) {
	withClient(t, deadAPI)
	withDynamic(t, deadDynamic)
	const corefile = `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster prereg-a
        kubeconfig /prereg-a
        peer prereg-b /prereg-b
    }
}`
	i, _, _, err := coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)

	want := map[string][]string{}
	prefix := "coredns_mcsannotations_"
	for _, cl := range []string{"prereg-a", "prereg-b"} {
		for _, r := range annotation.Reasons {
			want[prefix+"rejected_annotations_total"] = append(want[prefix+"rejected_annotations_total"], cl+","+string(r))
		}
		want[prefix+"source_expirations_total"] = append(want[prefix+"source_expirations_total"], cl)
		want[prefix+"unencodable_names_total"] = append(want[prefix+"unencodable_names_total"], cl)
		want[prefix+"stale_answers_total"] = append(want[prefix+"stale_answers_total"], cl)
	}
	informers := []string{"clients", "cluster/prereg-a", "cluster/prereg-b"}
	for _, name := range []string{"watch_expirations_total", "malformed_lists_total", "relist_seconds"} {
		want[prefix+name] = informers
	}
	want[prefix+"informer_slow_stops_total"] = append(informers, "serviceimports")
	want[prefix+"snapshot_errors_total"] = snapshotErrorKinds
	for name, keys := range want {
		got := series(t, name)
		for _, k := range keys {
			v, ok := got[k]
			if !ok {
				t.Errorf("%s{%s}: no series", name, k)
			} else if v != 0 && strings.Contains(k, "prereg-") { // series of other names (clients, snapshot errors) are shared with the package's other tests
				t.Errorf("%s{%s} = %v, want 0 (nothing happened)", name, k, v)
			}
		}
	}
}
