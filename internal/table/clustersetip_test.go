package table

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

func vip(ns, name string, ips []string, ports ...ImportPort) ClusterSetIP {
	ci := ClusterSetIP{Namespace: ns, Name: name, Ports: ports}
	for _, ip := range ips {
		ci.IPs = append(ci.IPs, netip.MustParseAddr(ip))
	}
	return ci
}

// A ClusterSetIP service answers its service and port names with its IPs;
// its endpoints keep their names; entries without IPs, and a later reset,
// leave the headless answers as they were.
func TestClusterSetIPLookup(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	tb.SetClusterSetIPs([]ClusterSetIP{
		vip("default", "backend", []string{"10.96.0.10"}, ImportPort{Name: "http", Protocol: "TCP", Port: 80}, ImportPort{Protocol: "TCP", Port: 81}),
		vip("other", "empty", nil, ImportPort{Name: "http", Protocol: "TCP", Port: 80}),
	})
	ix := tb.Rebuild()
	if ix.ClusterSetIPLen() != 1 {
		t.Fatalf("ClusterSetIPLen %d, want 1 (an entry without IPs does not count)", ix.ClusterSetIPLen())
	}
	for _, c := range []struct {
		q     string
		qtype uint16
		kind  Kind
	}{
		{"backend.default.svc.", dns.TypeA, KindClusterSetIP},
		{"backend.default.svc.", dns.TypeAAAA, KindNoData},
		{"backend.default.svc.", dns.TypeSRV, KindSRV},
		{"_http._tcp.backend.default.svc.", dns.TypeSRV, KindSRV},
		{"_http._tcp.backend.default.svc.", dns.TypeA, KindNoData},
		{"_tcp.backend.default.svc.", dns.TypeSRV, KindNoData},
		{"_https._tcp.backend.default.svc.", dns.TypeSRV, KindNXDomain},
		{"10-0-0-1.edge-a.backend.default.svc.", dns.TypeA, KindEndpoint},
		{"edge-a.backend.default.svc.", dns.TypeA, KindNXDomain},
		{"empty.other.svc.", dns.TypeA, KindNXDomain},
	} {
		if got := ix.Lookup(c.q+zone, c.qtype); got.Kind != c.kind {
			t.Errorf("%s %s: %s, want %s", c.q, dns.TypeToString[c.qtype], got.Kind, c.kind)
		}
	}
	a := ix.Lookup("backend.default.svc."+zone, dns.TypeA)
	if len(a.A) != 1 || a.A[0].A.String() != "10.96.0.10" {
		t.Errorf("A: %v", a.A)
	}
	srv := ix.Lookup("backend.default.svc."+zone, dns.TypeSRV).SRV
	if len(srv.SRV) != 1 || srv.SRV[0].Port != 80 || srv.SRV[0].Target != "backend.default.svc."+zone || len(srv.ExtraA) != 1 {
		t.Errorf("bare SRV (unnamed ports make none): %+v", srv)
	}
	// Through an alias: the ClusterSetIP, unless the import names a cluster.
	if got := ix.LookupService("default", "backend", "", "", dns.TypeA); got.Kind != KindClusterSetIP {
		t.Errorf("LookupService: %s", got.Kind)
	}
	if got := ix.LookupService("default", "backend", "edge-a", "", dns.TypeA); got.Kind != KindService || got.A[0].A.String() != "10.0.0.1" {
		t.Errorf("LookupService limited to a cluster: %+v", got)
	}

	tb.SetClusterSetIPs(nil)
	ix = tb.Rebuild()
	if a := ix.Lookup("backend.default.svc."+zone, dns.TypeA); a.Kind != KindService || a.A[0].A.String() != "10.0.0.1" {
		t.Errorf("after the ServiceImport went: %+v", a)
	}
}

// A ClusterSetIP service with no endpoint exists, and so does its namespace.
func TestClusterSetIPWithoutEndpoints(t *testing.T) {
	tb := newTable(cfg())
	tb.SetClusterSetIPs([]ClusterSetIP{vip("web", "vip", []string{"fd00:96::1", "10.96.0.1"})})
	ix := tb.Rebuild()
	if a := ix.Lookup("vip.web.svc."+zone, dns.TypeAAAA); a.Kind != KindClusterSetIP || len(a.AAAA) != 1 {
		t.Errorf("AAAA: %+v", a)
	}
	if a := ix.Lookup("vip.web.svc."+zone, dns.TypeSRV); a.Kind != KindNoData {
		t.Errorf("SRV without named ports: %s, want nodata", a.Kind)
	}
	if a := ix.Lookup("web.svc."+zone, dns.TypeA); a.Kind != KindNoData {
		t.Errorf("the namespace: %s, want nodata", a.Kind)
	}
	if a := ix.Lookup("x.edge-a.vip.web.svc."+zone, dns.TypeA); a.Kind != KindNXDomain {
		t.Errorf("an endpoint name: %s, want nxdomain", a.Kind)
	}
}

func TestClusterSetIPLookupDoesNotAllocate(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	tb.SetClusterSetIPs([]ClusterSetIP{vip("default", "backend", []string{"10.96.0.10"}, ImportPort{Name: "http", Protocol: "TCP", Port: 80})})
	ix := tb.Rebuild()
	for _, q := range []string{"backend.default.svc." + zone, "_http._tcp.backend.default.svc." + zone, "10-0-0-1.edge-a.backend.default.svc." + zone, "nope.default.svc." + zone} {
		if n := testing.AllocsPerRun(100, func() { ix.Lookup(q, dns.TypeA) }); n != 0 {
			t.Errorf("%s: %v allocations", q, n)
		}
	}
}

// The type of a service is its oldest export's (KEP-1645): when the entries
// agree it is theirs; when they disagree the oldest decides (no exportedAt is
// older than any, then the lower cluster ID). Deciding it allocates nothing,
// nor does counting the service's records for the cap.
func TestExportedClusterSetIP(t *testing.T) {
	typed := func(cluster, typ, at string) *store.Pod {
		e := export("backend", httpPort)
		e.Service = annotation.Service{Type: typ, ExportedAt: at}
		return pod(cluster, "default", "p-"+cluster+typ+at, "", true, []string{"10.0.0.1"}, e)
	}
	const early, late = "2026-01-01T00:00:00Z", "2026-06-01T00:00:00Z"
	tcfg := cfg()
	csip, headless := annotation.TypeClusterSetIP, annotation.TypeHeadless
	for _, c := range []struct {
		name string
		pods []*store.Pod
		want bool
	}{
		{"no entry", []*store.Pod{pod("edge-a", "default", "x", "", true, nil, export("other"))}, false},
		{"untyped", []*store.Pod{typed("edge-a", "", ""), typed("edge-b", "", late)}, false},
		{"all headless", []*store.Pod{typed("edge-a", headless, early), typed("edge-b", headless, late)}, false},
		{"all ClusterSetIP", []*store.Pod{typed("edge-a", csip, early), typed("edge-b", csip, "")}, true},
		{"older ClusterSetIP", []*store.Pod{typed("edge-a", headless, late), typed("edge-b", csip, early)}, true},
		{"older headless", []*store.Pod{typed("edge-a", csip, late), typed("edge-b", "", early)}, false},
		{"no exportedAt is older", []*store.Pod{typed("edge-a", headless, early), typed("edge-b", csip, "")}, true},
		{"tie: lower cluster", []*store.Pod{typed("edge-b", headless, early), typed("edge-a", csip, early)}, true},
	} {
		sk := svcKey{Namespace: "default", Name: "backend"}
		if got := exportedClusterSetIP(sk, c.pods); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		// Run for every service at every rebuild: no allocation.
		if n := testing.AllocsPerRun(10, func() { exportedClusterSetIP(sk, c.pods); recordCost(&tcfg, sk, c.pods) }); n != 0 {
			t.Errorf("%s: %v allocations", c.name, n)
		}
	}
}
