package mcsannotations

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// cappedSeries returns capped_records' series as namespace -> value.
func cappedSeries(t *testing.T) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1024)
	cappedRecords.Collect(ch)
	close(ch)
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "namespace" {
				out[l.GetValue()] = d.GetGauge().GetValue()
			}
		}
	}
	return out
}

// capPods returns n ready Pods of ns, each exporting svc with 4 named ports.
func capPods(ns, svc string, n int) []*store.Pod {
	e := annotation.Export{Name: svc, Namespace: ns, Cluster: "edge-a"}
	for p := range 4 {
		e.Ports = append(e.Ports, annotation.Port{Name: fmt.Sprintf("p%d", p), Port: int32(80 + p), TargetPort: int32(80 + p), Protocol: "TCP"})
	}
	c := &store.Common{Cluster: "edge-a", Namespace: ns, Exports: []annotation.Export{e}}
	out := make([]*store.Pod, n)
	for i := range out {
		out[i] = &store.Pod{Common: c, Name: fmt.Sprintf("%s-%d", svc, i), Ready: true, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 3, 0, byte(i)})}}
	}
	return out
}

// capped_records has a series only for a namespace over
// records_per_namespace: it appears when the namespace is capped and is
// deleted when it is within the cap again, or gone (a series per namespace
// ever capped would grow without bound on a cluster whose namespaces come
// and go). It fails with the gauge set to 0 instead.
func TestCappedRecordsSeriesDeleted(t *testing.T) {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a", Locality: table.Any, NamespaceRecords: 50})
	tb.OnCapped(logCapped)
	tb.ReplaceCluster("edge-a", append(capPods("cap-shrinks", "a", 20), capPods("cap-goes", "b", 20)...))
	tb.Rebuild()
	got := cappedSeries(t)
	if got["cap-shrinks"] <= 0 || got["cap-goes"] <= 0 {
		t.Fatalf("capped_records %v, want both namespaces capped", got)
	}
	// One shrinks within the cap, the other loses all its Pods.
	tb.ReplaceCluster("edge-a", capPods("cap-shrinks", "a", 2))
	tb.Rebuild()
	got = cappedSeries(t)
	for _, ns := range []string{"cap-shrinks", "cap-goes"} {
		if v, ok := got[ns]; ok {
			t.Errorf("capped_records{namespace=%q} = %v after it was within the cap, want no series", ns, v)
		}
	}
}
