package mcscontroller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// mcs_controller_cluster_last_contact_seconds has a series per cluster the
// controller reads from the moment it is made (the alert on a stale peer
// needs it before anything goes wrong): the seconds since its API server
// answered, -1 for one that never has.
func TestClusterLastContact(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if n, err := testutil.GatherAndCount(reg, "mcs_controller_cluster_last_contact_seconds"); err != nil || n != 0 {
		t.Fatalf("before New: %d series, %v", n, err)
	}
	srcs := []Source{newSource("edge-a", true, time.Now()), newSource("edge-b", true, time.Now().Add(-time.Hour)), newSource("edge-c", false, time.Time{})}
	New(store.New(), srcs, fake.NewClientset(), nil, nil, Config{LocalCluster: "edge-a"}, m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "mcs_controller_cluster_last_contact_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			got[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
	}
	if len(got) != 3 || got["edge-a"] < 0 || got["edge-a"] > 60 || got["edge-b"] < 3600 || got["edge-c"] != -1 {
		t.Errorf("last contact by cluster: %v, want edge-a recent, edge-b an hour ago, edge-c -1", got)
	}
}
