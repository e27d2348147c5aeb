package mcsannotations

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
)

// A clusterCounters scrapes as the CounterVec it stands for: same name,
// help, type, labels and values, a series at 0 included; a negative Add
// panics, as a Counter's does.
func TestClusterCountersExpose(t *testing.T) {
	opts := prometheus.CounterOpts{Namespace: "coredns", Subsystem: "test", Name: "things_total", Help: "Things, by cluster."}
	vec, ours := prometheus.NewCounterVec(opts, []string{"cluster"}), makeClusterCounters(opts)
	for _, c := range []interface {
		WithLabelValues(...string) prometheus.Counter
	}{vec, variadic{ours}} {
		c.WithLabelValues("edge-a").Inc()
		c.WithLabelValues("edge-a").Add(2.5)
		c.WithLabelValues("edge-b")
		c.WithLabelValues("edge-c").Inc()
	}
	want, err := testutil.CollectAndFormat(vec, expfmt.TypeTextPlain)
	if err != nil {
		t.Fatal(err)
	}
	got, err := testutil.CollectAndFormat(ours, expfmt.TypeTextPlain)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("exposition:\n%s\nwant (a CounterVec's):\n%s", got, want)
	}
	if v := testutil.ToFloat64(ours.WithLabelValues("edge-a")); v != 3.5 {
		t.Errorf("edge-a = %v, want 3.5", v)
	}
	defer func() {
		if recover() == nil {
			t.Error("a negative Add did not panic")
		}
	}()
	ours.WithLabelValues("edge-a").Add(-1)
}

type variadic struct{ c *clusterCounters }

func (v variadic) WithLabelValues(lvs ...string) prometheus.Counter {
	return v.c.WithLabelValues(lvs[0])
}

// The per-cluster series an edge holds for every relayed origin
// (stale_answers_total, source_expirations_total) cost little heap each: a
// CounterVec's series costs several hundred bytes.
func TestClusterSeriesAreSmall(t *testing.T) {
	const n = 5000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("small-series-%05d", i)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for _, cl := range names {
		staleAnswers.WithLabelValues(cl)
		sourceExpirations.WithLabelValues(cl)
	}
	per := float64(heap()-before) / (2 * n)
	runtime.KeepAlive(names)
	t.Logf("%.0f B per series", per)
	if per > 128 {
		t.Errorf("%.0f B per series, want at most 128", per)
	}
}
