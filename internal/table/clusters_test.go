package table

import (
	"slices"
	"testing"

	"github.com/miekg/dns"
)

// Each answer names the clusters whose records it holds, and only those:
// what a stale answer is marked with. The service's addresses by family, SRV
// answers by their targets, an endpoint name by its own cluster; a
// ClusterSetIP (no cluster's record) names none.
func TestAnswerClusters(t *testing.T) {
	build := func(locality Locality) *Index {
		c := cfg()
		c.Locality = locality
		tb := newTable(c)
		tb.Upsert(pod("edge-a", "default", "a1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
		tb.Upsert(pod("edge-b", "default", "b1", "", true, []string{"10.1.0.1", "fd01::1"}, export("backend", httpPort)))
		tb.Upsert(pod("edge-c", "default", "c1", "", true, []string{"fd02::1"}, export("backend", httpPort)))
		tb.Upsert(pod("edge-c", "default", "c2", "", true, []string{"10.2.0.1"}, export("vip", httpPort)))
		tb.SetClusterSetIPs([]ClusterSetIP{vip("default", "vip", []string{"10.96.0.10"}, ImportPort{Name: "http", Protocol: "TCP", Port: 80})})
		return tb.Rebuild()
	}
	anyIx, localIx := build(Any), build(PreferLocal)
	for _, c := range []struct {
		ix    *Index
		q     string
		qtype uint16
		want  []string
	}{
		{anyIx, "backend.default.svc.", dns.TypeA, []string{"edge-a", "edge-b"}},
		{anyIx, "backend.default.svc.", dns.TypeAAAA, []string{"edge-b", "edge-c"}},
		{anyIx, "backend.default.svc.", dns.TypeSRV, []string{"edge-a", "edge-b", "edge-c"}},
		{anyIx, "_http._tcp.backend.default.svc.", dns.TypeSRV, []string{"edge-a", "edge-b", "edge-c"}},
		{anyIx, "10-1-0-1.edge-b.backend.default.svc.", dns.TypeA, []string{"edge-b"}},
		{anyIx, "fd02--1.edge-c.backend.default.svc.", dns.TypeAAAA, []string{"edge-c"}},
		{anyIx, "10-2-0-1.edge-c.vip.default.svc.", dns.TypeA, []string{"edge-c"}},
		{anyIx, "vip.default.svc.", dns.TypeA, nil},
		{anyIx, "backend.default.svc.", dns.TypeMX, nil},
		{anyIx, "nope.default.svc.", dns.TypeA, nil},
		// The locality policy answers the local cluster's endpoints alone.
		{localIx, "backend.default.svc.", dns.TypeA, []string{"edge-a"}},
		{localIx, "backend.default.svc.", dns.TypeSRV, []string{"edge-a"}},
		{localIx, "10-1-0-1.edge-b.backend.default.svc.", dns.TypeA, []string{"edge-b"}},
	} {
		if got := c.ix.Lookup(c.q+zone, c.qtype).Clusters; !slices.Equal(got, c.want) {
			t.Errorf("%s %s: clusters %q, want %q", c.q, dns.TypeToString[c.qtype], got, c.want)
		}
	}
	// An import that names a cluster: that cluster's records alone.
	if got := localIx.LookupService("default", "backend", "edge-b", "", dns.TypeA).Clusters; !slices.Equal(got, []string{"edge-b"}) {
		t.Errorf("backend in edge-b: clusters %q", got)
	}
}
