package table

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

const zone = "clusterset.local."

func cfg() Config { return Config{Zone: zone, TTL: 5, LocalCluster: "edge-a", Locality: PreferLocal} }

// testTable is a table over a store of its own: a test writes records to the
// store and reads answers from the table.
type testTable struct {
	*Table
	*store.Store
}

func newTable(c Config) testTable {
	st := store.New()
	return testTable{New(c, st), st}
}

func pod(cluster, ns, name, hostname string, ready bool, ips []string, exports ...annotation.Export) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: ns}, Name: name, Hostname: hostname, Ready: ready}
	for _, s := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(s))
	}
	for i := range exports {
		exports[i].Cluster = cluster
		if exports[i].Namespace == "" {
			exports[i].Namespace = ns
		}
	}
	p.Exports = exports
	return p
}

func export(name string, ports ...annotation.Port) annotation.Export {
	return annotation.Export{Name: name, Ports: ports}
}

var httpPort = annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}

func addrs(a Answer) []string {
	var out []string
	for _, r := range a.A {
		out = append(out, r.A.String())
	}
	for _, r := range a.AAAA {
		out = append(out, r.AAAA.String())
	}
	slices.Sort(out)
	return out
}

func srvs(a Answer) []string {
	if a.SRV == nil {
		return nil
	}
	var out []string
	for _, r := range a.SRV.SRV {
		out = append(out, fmt.Sprintf("%d %s", r.Port, r.Target))
	}
	slices.Sort(out)
	return out
}

func TestLookup(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1", "fd00::1"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-a", "default", "b2", "web-0", true, []string{"10.0.0.2"}, export("backend", httpPort, annotation.Port{Name: "dns", Port: 53, TargetPort: 5353, Protocol: "UDP"}), export("other")))
	tb.Upsert(pod("edge-a", "default", "b3", "", false, []string{"10.0.0.3"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-b", "default", "b4", "", true, []string{"10.1.0.4"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-b", "default", "peer-only", "", true, []string{"10.1.0.5"}, export("remote", httpPort)))
	tb.Upsert(pod("edge-a", "default", "notready", "", false, []string{"10.0.0.9"}, export("down")))
	// Two Pods with one spec.hostname in one cluster collapse into one SRV target.
	tb.Upsert(pod("edge-b", "default", "r1", "same", true, []string{"10.1.0.6"}, export("twins", httpPort)))
	tb.Upsert(pod("edge-b", "default", "r2", "same", true, []string{"10.1.0.7"}, export("twins", httpPort)))
	ix := tb.Rebuild()

	tests := []struct {
		qname string
		qtype uint16
		kind  Kind
		addrs []string
		srvs  []string
	}{
		{"backend.default.svc." + zone, dns.TypeA, KindService, []string{"10.0.0.1", "10.0.0.2"}, nil},
		{"backend.default.svc." + zone, dns.TypeAAAA, KindService, []string{"fd00::1"}, nil},
		{"backend.default.svc." + zone, dns.TypeTXT, KindNoData, nil, nil},
		{"backend.default.svc." + zone, dns.TypeSRV, KindSRV, nil, []string{
			"5353 web-0.edge-a.backend.default.svc." + zone,
			"8080 10-0-0-1.edge-a.backend.default.svc." + zone,
			"8080 web-0.edge-a.backend.default.svc." + zone,
		}},
		{"_http._tcp.backend.default.svc." + zone, dns.TypeSRV, KindSRV, nil, []string{
			"8080 10-0-0-1.edge-a.backend.default.svc." + zone,
			"8080 web-0.edge-a.backend.default.svc." + zone,
		}},
		{"_dns._udp.backend.default.svc." + zone, dns.TypeSRV, KindSRV, nil, []string{"5353 web-0.edge-a.backend.default.svc." + zone}},
		{"_http._tcp.backend.default.svc." + zone, dns.TypeA, KindNoData, nil, nil},
		{"_tcp.backend.default.svc." + zone, dns.TypeSRV, KindNoData, nil, nil},
		{"_http._udp.backend.default.svc." + zone, dns.TypeSRV, KindNXDomain, nil, nil},
		{"_nope._tcp.backend.default.svc." + zone, dns.TypeSRV, KindNXDomain, nil, nil},
		// Per-endpoint names cover every cluster, whatever the locality.
		{"10-0-0-1.edge-a.backend.default.svc." + zone, dns.TypeA, KindEndpoint, []string{"10.0.0.1"}, nil},
		{"10-0-0-1.edge-a.backend.default.svc." + zone, dns.TypeAAAA, KindEndpoint, []string{"fd00::1"}, nil},
		{"web-0.edge-a.backend.default.svc." + zone, dns.TypeA, KindEndpoint, []string{"10.0.0.2"}, nil},
		{"web-0.edge-a.backend.default.svc." + zone, dns.TypeAAAA, KindNoData, nil, nil},
		{"10-1-0-4.edge-b.backend.default.svc." + zone, dns.TypeA, KindEndpoint, []string{"10.1.0.4"}, nil},
		{"10-0-0-3.edge-a.backend.default.svc." + zone, dns.TypeA, KindNXDomain, nil, nil}, // not ready
		{"10-0-0-1.edge-b.backend.default.svc." + zone, dns.TypeA, KindNXDomain, nil, nil}, // wrong cluster
		{"edge-a.backend.default.svc." + zone, dns.TypeA, KindNXDomain, nil, nil},          // reserved
		// No local endpoint: the peers' answer.
		{"remote.default.svc." + zone, dns.TypeA, KindService, []string{"10.1.0.5"}, nil},
		{"down.default.svc." + zone, dns.TypeA, KindNXDomain, nil, nil},
		{"other.default.svc." + zone, dns.TypeA, KindService, []string{"10.0.0.2"}, nil},
		{"other.default.svc." + zone, dns.TypeSRV, KindNoData, nil, nil}, // no named ports
		{"twins.default.svc." + zone, dns.TypeA, KindService, []string{"10.1.0.6", "10.1.0.7"}, nil},
		{"twins.default.svc." + zone, dns.TypeSRV, KindSRV, nil, []string{"8080 same.edge-b.twins.default.svc." + zone}},
		{"same.edge-b.twins.default.svc." + zone, dns.TypeA, KindEndpoint, []string{"10.1.0.6", "10.1.0.7"}, nil},
		{"missing.default.svc." + zone, dns.TypeA, KindNXDomain, nil, nil},
		{"default.svc." + zone, dns.TypeA, KindNoData, nil, nil},
		{"nons.svc." + zone, dns.TypeA, KindNXDomain, nil, nil},
		{"svc." + zone, dns.TypeA, KindNoData, nil, nil},
		{"backend.default." + zone, dns.TypeA, KindNXDomain, nil, nil},
		{"backend.default.pod." + zone, dns.TypeA, KindNXDomain, nil, nil},
		{zone, dns.TypeSOA, KindApex, nil, nil},
		{zone, dns.TypeNS, KindApex, nil, nil},
		{zone, dns.TypeA, KindNoData, nil, nil},
		{"dns-version." + zone, dns.TypeTXT, KindVersion, nil, nil},
		{"dns-version." + zone, dns.TypeA, KindNoData, nil, nil},
		{"ns.dns." + zone, dns.TypeA, KindNameserver, nil, nil},
		{"dns." + zone, dns.TypeA, KindNoData, nil, nil},
		{"a.b.c.d.e.backend.default.svc." + zone, dns.TypeA, KindNXDomain, nil, nil},
		{"xclusterset.local.", dns.TypeA, KindNXDomain, nil, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%s", tc.qname, dns.TypeToString[tc.qtype]), func(t *testing.T) {
			a := ix.Lookup(tc.qname, tc.qtype)
			if a.Kind != tc.kind {
				t.Fatalf("kind %v, want %v", a.Kind, tc.kind)
			}
			if got := addrs(a); !slices.Equal(got, tc.addrs) {
				t.Errorf("addresses %v, want %v", got, tc.addrs)
			}
			if got := srvs(a); !slices.Equal(got, tc.srvs) {
				t.Errorf("SRV %v, want %v", got, tc.srvs)
			}
		})
	}

	// Additional section: one address set per distinct SRV target.
	a := ix.Lookup("backend.default.svc."+zone, dns.TypeSRV)
	if len(a.SRV.ExtraA) != 2 || len(a.SRV.ExtraAAAA) != 1 {
		t.Errorf("extra: %d A, %d AAAA; want 2 and 1", len(a.SRV.ExtraA), len(a.SRV.ExtraAAAA))
	}
	for _, r := range a.SRV.SRV {
		if r.Weight == 0 || r.Hdr.Ttl != 5 {
			t.Errorf("SRV %v: weight and TTL must be set", r.String())
		}
	}
}

func TestLocalityAny(t *testing.T) {
	c := cfg()
	c.Locality = Any
	tb := newTable(c)
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.1"}, export("backend")))
	tb.Upsert(pod("edge-b", "default", "b", "", true, []string{"10.1.0.1"}, export("backend")))
	got := addrs(tb.Rebuild().Lookup("backend.default.svc."+zone, dns.TypeA))
	if !slices.Equal(got, []string{"10.0.0.1", "10.1.0.1"}) {
		t.Errorf("got %v", got)
	}
}

// A and AAAA cover the same endpoint subset: a local IPv4-only endpoint hides
// a peer's IPv6 endpoint from AAAA too.
func TestLocalitySameSubsetForAAndAAAA(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.1"}, export("backend")))
	tb.Upsert(pod("edge-b", "default", "b", "", true, []string{"fd00::2"}, export("backend")))
	ix := tb.Rebuild()
	if k := ix.Lookup("backend.default.svc."+zone, dns.TypeAAAA).Kind; k != KindNoData {
		t.Errorf("AAAA: %v, want nodata", k)
	}
}

func TestUpdatesAndDeletes(t *testing.T) {
	tb := newTable(cfg())
	q := "backend.default.svc." + zone
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.1"}, export("backend")))
	if got := addrs(tb.Rebuild().Lookup(q, dns.TypeA)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("add: %v", got)
	}
	// IP change.
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.7"}, export("backend")))
	if got := addrs(tb.Rebuild().Lookup(q, dns.TypeA)); !slices.Equal(got, []string{"10.0.0.7"}) {
		t.Fatalf("ip change: %v", got)
	}
	// The annotation moves the Pod to another service: the old name goes.
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.7"}, export("frontend")))
	ix := tb.Rebuild()
	if k := ix.Lookup(q, dns.TypeA).Kind; k != KindNXDomain {
		t.Fatalf("moved: old name %v", k)
	}
	if got := addrs(ix.Lookup("frontend.default.svc."+zone, dns.TypeA)); !slices.Equal(got, []string{"10.0.0.7"}) {
		t.Fatalf("moved: new name %v", got)
	}
	// Not ready, then deleted.
	tb.Upsert(pod("edge-a", "default", "a", "", false, []string{"10.0.0.7"}, export("frontend")))
	if k := tb.Rebuild().Lookup("frontend.default.svc."+zone, dns.TypeA).Kind; k != KindNXDomain {
		t.Fatalf("not ready: %v", k)
	}
	tb.Delete(store.Key{Cluster: "edge-a", Namespace: "default", Name: "a"})
	tb.Delete(store.Key{Cluster: "edge-a", Namespace: "default", Name: "never-existed"})
	ix = tb.Rebuild()
	if ix.Len() != 0 || len(tb.Pods("")) != 0 {
		t.Fatalf("after delete: %d services, %d pods", ix.Len(), len(tb.Pods("")))
	}
	if k := ix.Lookup("default.svc."+zone, dns.TypeA).Kind; k != KindNXDomain {
		t.Fatalf("empty namespace still exists: %v", k)
	}
}

func TestReplaceCluster(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-b", "default", "keep", "", true, []string{"10.1.0.1"}, export("backend")))
	tb.Upsert(pod("edge-b", "default", "gone", "", true, []string{"10.1.0.2"}, export("backend")))
	tb.Upsert(pod("edge-c", "default", "other", "", true, []string{"10.2.0.1"}, export("backend")))
	tb.Rebuild()
	tb.ReplaceCluster("edge-b", []*store.Pod{
		pod("edge-b", "default", "keep", "", true, []string{"10.1.0.1"}, export("backend")),
		pod("edge-b", "default", "new", "", true, []string{"10.1.0.3"}, export("backend")),
	})
	got := addrs(tb.Rebuild().Lookup("backend.default.svc."+zone, dns.TypeA))
	if !slices.Equal(got, []string{"10.1.0.1", "10.1.0.3", "10.2.0.1"}) {
		t.Errorf("got %v", got)
	}
	if n := tb.Len(); n["edge-b"] != 2 || n["edge-c"] != 1 {
		t.Errorf("len %v", n)
	}
}

// A table made over a store that holds records already takes them at New
// (the store's feed hands a new subscriber what it holds), and then follows
// the store's writes.
func TestNewOverFilledStore(t *testing.T) {
	st := store.New()
	st.ReplaceCluster("edge-b", []*store.Pod{
		pod("edge-b", "default", "b1", "", true, []string{"10.1.0.1"}, export("backend")),
		pod("edge-b", "default", "b2", "", true, []string{"10.1.0.2"}, export("backend")),
	})
	tb := New(cfg(), st)
	q := "backend.default.svc." + zone
	if got := addrs(tb.Rebuild().Lookup(q, dns.TypeA)); !slices.Equal(got, []string{"10.1.0.1", "10.1.0.2"}) {
		t.Errorf("after New: %v", got)
	}
	st.Delete(store.Key{Cluster: "edge-b", Namespace: "default", Name: "b1"})
	if got := addrs(tb.Rebuild().Lookup(q, dns.TypeA)); !slices.Equal(got, []string{"10.1.0.2"}) {
		t.Errorf("after a delete: %v", got)
	}
}

// ReplaceCluster links records in groups of one Common: a group whose
// records export two services joins both, records with equal but separate
// Commons join as well, and a second replace keeps, adds and drops records
// of a shared Common one by one.
func TestReplaceClusterSharedCommons(t *testing.T) {
	both := &store.Common{Cluster: "edge-b", Namespace: "default", Exports: []annotation.Export{
		{Name: "backend", Namespace: "default", Cluster: "edge-b", Ports: []annotation.Port{httpPort}},
		{Name: "frontend", Namespace: "default", Cluster: "edge-b", Ports: []annotation.Port{httpPort}},
	}}
	rec := func(name, ip string, c *store.Common) *store.Pod {
		return &store.Pod{Common: c, Name: name, Ready: true, IPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	own := func(name, ip string) *store.Pod {
		return pod("edge-b", "default", name, "", true, []string{ip}, export("backend", httpPort))
	}
	lookup := func(ix *Index, svc string) []string {
		return addrs(ix.Lookup(svc+".default.svc."+zone, dns.TypeA))
	}
	tb := newTable(cfg())
	tb.ReplaceCluster("edge-b", []*store.Pod{
		rec("s1", "10.1.0.1", both), own("o1", "10.1.0.11"), rec("s2", "10.1.0.2", both),
		own("o2", "10.1.0.12"), rec("s3", "10.1.0.3", both),
	})
	ix := tb.Rebuild()
	if got, want := lookup(ix, "backend"), []string{"10.1.0.1", "10.1.0.11", "10.1.0.12", "10.1.0.2", "10.1.0.3"}; !slices.Equal(got, want) {
		t.Errorf("backend: %v, want %v", got, want)
	}
	if got, want := lookup(ix, "frontend"), []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}; !slices.Equal(got, want) {
		t.Errorf("frontend: %v, want %v", got, want)
	}
	// s1 unchanged, s2 moved, s3 gone, s4 new; o1 gone.
	tb.ReplaceCluster("edge-b", []*store.Pod{
		rec("s1", "10.1.0.1", both), rec("s2", "10.1.0.22", both), rec("s4", "10.1.0.4", both), own("o2", "10.1.0.12"),
	})
	ix = tb.Rebuild()
	if got, want := lookup(ix, "backend"), []string{"10.1.0.1", "10.1.0.12", "10.1.0.22", "10.1.0.4"}; !slices.Equal(got, want) {
		t.Errorf("backend after the second replace: %v, want %v", got, want)
	}
	if got, want := lookup(ix, "frontend"), []string{"10.1.0.1", "10.1.0.22", "10.1.0.4"}; !slices.Equal(got, want) {
		t.Errorf("frontend after the second replace: %v, want %v", got, want)
	}
}

// While writers churn, every index a reader sees answers with the endpoint
// that never changes: no reader ever sees the service empty.
func TestRunNoGapUnderChurn(t *testing.T) {
	tb := newTable(cfg())
	changed := make(chan struct{}, 1)
	tb.OnChange(func(*Index) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tb.Run(ctx)
	stable := pod("edge-b", "default", "stable", "", true, []string{"10.1.0.1"}, export("backend"))
	tb.Upsert(stable)
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the builder did not publish an index")
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			p := pod("edge-b", "default", fmt.Sprintf("p%d", i%20), "", i%3 != 0, []string{fmt.Sprintf("10.1.1.%d", i%200)}, export("backend"))
			tb.Upsert(p)
			if i%7 == 0 {
				tb.Delete(p.Key())
			}
			if i%500 == 0 {
				tb.ReplaceCluster("edge-b", []*store.Pod{stable, p})
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for reads := 0; ; reads++ {
		a := tb.Index().Lookup("backend.default.svc."+zone, dns.TypeA)
		if !slices.Contains(addrs(a), "10.1.0.1") {
			t.Fatalf("read %d: stable endpoint missing: %v", reads, addrs(a))
		}
		select {
		case <-done:
			tb.Rebuild()
			if !slices.Contains(addrs(tb.Index().Lookup("backend.default.svc."+zone, dns.TypeA)), "10.1.0.1") {
				t.Fatal("final index lost the stable endpoint")
			}
			return
		default:
		}
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	// A name and namespace longer than a short string's room on the stack.
	const long, longNS = "payments-backend-with-a-long-name", "production-east-with-a-long-name"
	tb.Upsert(pod("edge-a", longNS, "p1", "", true, []string{"10.0.0.2"}, export(long, httpPort)))
	ix := tb.Rebuild()
	for _, q := range []string{"backend.default.svc." + zone, "_http._tcp.backend.default.svc." + zone, "10-0-0-1.edge-a.backend.default.svc." + zone, "nope.default.svc." + zone,
		long + "." + longNS + ".svc." + zone} {
		if n := testing.AllocsPerRun(100, func() { ix.Lookup(q, dns.TypeA) }); n != 0 {
			t.Errorf("%s: %v allocations", q, n)
		}
	}
	// Alias names answer through LookupService, with or without a cluster.
	for _, q := range []struct{ ns, name, cluster, prefix string }{
		{"default", "backend", "", ""}, {longNS, long, "", ""}, {longNS, long, "", "_http._tcp"}, {longNS, long, "", "10-0-0-2.edge-a"},
		{longNS, long, "edge-a", ""}, {longNS, "nope-" + long, "", ""}, {longNS, "nope-" + long, "edge-a", ""},
	} {
		if n := testing.AllocsPerRun(100, func() { ix.LookupService(q.ns, q.name, q.cluster, q.prefix, dns.TypeA) }); n != 0 {
			t.Errorf("alias to %+v: %v allocations", q, n)
		}
		if n := testing.AllocsPerRun(100, func() { ix.Allowed(q.ns, q.name, "client") }); n != 0 {
			t.Errorf("Allowed(%s, %s): %v allocations", q.ns, q.name, n)
		}
	}
}

func FuzzLookup(f *testing.F) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	ix := tb.Rebuild()
	for _, s := range []string{"backend.default.svc." + zone, ".default.svc." + zone, "..svc." + zone, "_.x.svc." + zone, zone, "." + zone} {
		f.Add(s, uint16(dns.TypeA))
	}
	f.Fuzz(func(t *testing.T, q string, qtype uint16) {
		ix.Lookup(q, qtype)
	})
}

func TestLookupServiceInCluster(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-b", "default", "b", "", true, []string{"10.1.0.1"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-c", "default", "c", "", true, []string{"10.2.0.1"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-b", "default", "d", "", true, []string{"10.1.0.9"}, export("db")))
	ix := tb.Rebuild()
	tests := []struct {
		name, cluster, prefix string
		qtype                 uint16
		kind                  Kind
		addrs, srvs           []string
	}{
		{"backend", "", "", dns.TypeA, KindService, []string{"10.0.0.1"}, nil}, // locality
		{"backend", "edge-b", "", dns.TypeA, KindService, []string{"10.1.0.1"}, nil},
		{"backend", "edge-c", "_http._tcp", dns.TypeSRV, KindSRV, nil, []string{"8080 10-2-0-1.edge-c.backend.default.svc." + zone}},
		{"backend", "edge-x", "", dns.TypeA, KindNXDomain, nil, nil},
		{"backend", "edge-b", "10-1-0-1.edge-b", dns.TypeA, KindEndpoint, []string{"10.1.0.1"}, nil},
		{"db", "edge-b", "", dns.TypeA, KindService, []string{"10.1.0.9"}, nil}, // one cluster
		{"db", "edge-a", "", dns.TypeA, KindNXDomain, nil, nil},
		{"nope", "", "", dns.TypeA, KindNXDomain, nil, nil},
	}
	for _, tc := range tests {
		a := ix.LookupService("default", tc.name, tc.cluster, tc.prefix, tc.qtype)
		if a.Kind != tc.kind || !slices.Equal(addrs(a), tc.addrs) || !slices.Equal(srvs(a), tc.srvs) {
			t.Errorf("%+v: got %v %v %v", tc, a.Kind, addrs(a), srvs(a))
		}
	}
}

func TestSplitServiceName(t *testing.T) {
	for q, want := range map[string][4]string{
		"backend.default.svc." + zone:                   {"", "backend", "default", "ok"},
		"_http._tcp.backend.default.svc." + zone:        {"_http._tcp", "backend", "default", "ok"},
		"h.edge-a.backend.default.svc." + zone:          {"h.edge-a", "backend", "default", "ok"},
		"default.svc." + zone:                           {},
		"svc." + zone:                                   {},
		"backend.default." + zone:                       {},
		"backend.default.svc.other.":                    {},
		".backend.default.svc." + zone:                  {},
		"backend..svc." + zone:                          {},
		"backend.default.svc.xclusterset.local.":        {},
		"a.backend.default.svc.clusterset.local.extra.": {},
	} {
		p, n, ns, ok := SplitServiceName(q, zone)
		got := [4]string{p, n, ns, ""}
		if ok {
			got[3] = "ok"
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", q, got, want)
		}
	}
}

// Random upserts, deletes and cluster replacements in the store keep the
// table's services' lists, and so its answers, equal to what a plain map of
// records gives (the store's own records and feed: internal/store's
// TestRandomOpsMatchModel).
func TestRandomOpsMatchModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clusters := []string{"edge-a", "edge-b"}
	namespaces := []string{"default", "prod"}
	// Half the records share their Common with the others of their
	// service, as sources and the snapshot's decoder hand them out; the
	// rest have their own.
	commons := map[string]*store.Common{}
	randPod := func(cluster string) *store.Pod {
		ns := namespaces[rng.IntN(len(namespaces))]
		name := fmt.Sprintf("p%d", rng.IntN(6))
		ip := fmt.Sprintf("10.%d.%d.%d", rng.IntN(2), rng.IntN(2), rng.IntN(3))
		svc := fmt.Sprintf("svc%d", rng.IntN(3))
		p := pod(cluster, ns, name, "", rng.IntN(4) != 0, []string{ip}, export(svc))
		if rng.IntN(2) == 0 {
			k := cluster + "/" + ns + "/" + svc
			if c := commons[k]; c != nil {
				p.Common = c
			} else {
				commons[k] = p.Common
			}
		}
		return p
	}
	tb := newTable(cfg())
	model := map[store.Key]*store.Pod{}
	var pending *Index
	var pendingModel map[store.Key]*store.Pod
	check := func(step int, ix *Index, model map[store.Key]*store.Pod) {
		t.Helper()
		for _, ns := range namespaces {
			for s := range 3 {
				svc := fmt.Sprintf("svc%d", s)
				want := map[string]bool{}
				local := false
				for _, p := range model {
					if p.Namespace == ns && p.Ready && p.Exports[0].Name == svc && p.Cluster == "edge-a" {
						local = true
					}
				}
				for _, p := range model {
					if p.Namespace == ns && p.Ready && p.Exports[0].Name == svc && (!local || p.Cluster == "edge-a") {
						want[p.IPs[0].String()] = true
					}
				}
				var w []string
				for ip := range want {
					w = append(w, ip)
				}
				slices.Sort(w)
				a := ix.Lookup(svc+"."+ns+".svc."+zone, dns.TypeA)
				if g := slices.Compact(addrs(a)); !slices.Equal(g, w) {
					t.Fatalf("step %d: %s.%s answers %v, model %v", step, svc, ns, g, w)
				}
			}
		}
	}
	for step := 0; step < 3000; step++ {
		cluster := clusters[rng.IntN(len(clusters))]
		switch op := rng.IntN(10); {
		case op < 6:
			p := randPod(cluster)
			tb.Upsert(p)
			model[p.Key()] = p
		case op < 8:
			p := randPod(cluster)
			tb.Delete(p.Key())
			delete(model, p.Key())
		default:
			var pods []*store.Pod
			for range rng.IntN(8) {
				pods = append(pods, randPod(cluster))
			}
			pods = append(pods, randPod("edge-other")) // ignored
			tb.ReplaceCluster(cluster, pods)
			for k := range model {
				if k.Cluster == cluster {
					delete(model, k)
				}
			}
			for _, p := range pods {
				if p.Cluster == cluster {
					model[p.Key()] = p
				}
			}
		}
		// An index is immutable: one built 25 steps ago, and never asked
		// until now (its answers are rendered on first use), still answers
		// as the model did then, whatever the table did since.
		switch step % 50 {
		case 25:
			pending, pendingModel = tb.Rebuild(), maps.Clone(model)
		case 0:
			check(step, tb.Rebuild(), model)
			if pending != nil {
				check(step, pending, pendingModel)
			}
		}
	}
}

// Rendering shares what answers alike: with one named port, the service's SRV
// answer and the port's are one set; with two ports they differ; the
// service's addresses and the SRV additional records are the endpoints' own
// records, and two endpoints with one hostname still answer apart from the
// next one. One cluster's answers of a multi-cluster service are rendered on
// first ask, once, whoever asks at the same time.
func TestRenderSharing(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "a", "", true, []string{"10.0.0.1"}, export("web", httpPort)))
	tb.Upsert(pod("edge-b", "default", "b", "", true, []string{"10.1.0.1"}, export("web", httpPort)))
	dnsPort := annotation.Port{Name: "dns", Port: 53, TargetPort: 5353, Protocol: "UDP"}
	tb.Upsert(pod("edge-a", "default", "c", "", true, []string{"10.0.0.3"}, export("two", httpPort, dnsPort)))
	tb.Upsert(pod("edge-a", "default", "x", "a-dup", true, []string{"10.0.3.1"}, export("dup")))
	tb.Upsert(pod("edge-a", "default", "y", "a-dup", true, []string{"10.0.3.2"}, export("dup")))
	tb.Upsert(pod("edge-a", "default", "z", "b", true, []string{"10.0.3.3"}, export("dup")))
	ix := tb.Rebuild()

	for host, want := range map[string][]string{"a-dup": {"10.0.3.1", "10.0.3.2"}, "b": {"10.0.3.3"}} {
		if got := addrs(ix.Lookup(host+".edge-a.dup.default.svc."+zone, dns.TypeA)); !slices.Equal(got, want) {
			t.Errorf("%s.edge-a.dup: %v, want %v", host, got, want)
		}
	}
	if got := addrs(ix.Lookup("dup.default.svc."+zone, dns.TypeA)); !slices.Equal(got, []string{"10.0.3.1", "10.0.3.2", "10.0.3.3"}) {
		t.Errorf("dup: %v", got)
	}

	web := ix.Service("default", "web")
	if web.SRV[""] != web.SRV["_http._tcp"] {
		t.Error("one named port: the service's and the port's SRV sets are not shared")
	}
	own := web.Hosts["10-0-0-1.edge-a"].A
	if &web.A[0] != &own[0] || &web.SRV[""].ExtraA[0] != &own[0] {
		t.Error("the service's addresses or the SRV additional records copy the endpoint's records")
	}
	two := ix.Service("default", "two")
	if two.SRV[""] == two.SRV["_http._tcp"] || two.SRV["_http._tcp"] == two.SRV["_dns._udp"] {
		t.Error("two named ports: sets that answer differently are shared")
	}
	if got := srvs(ix.Lookup("_dns._udp.two.default.svc."+zone, dns.TypeSRV)); !slices.Equal(got, []string{"5353 10-0-0-3.edge-a.two.default.svc." + zone}) {
		t.Errorf("_dns._udp.two: %v", got)
	}
	if got := srvs(ix.Lookup("two.default.svc."+zone, dns.TypeSRV)); len(got) != 2 {
		t.Errorf("two: %v", got)
	}

	if web.perCluster != nil || web.pods == nil {
		t.Fatal("per-cluster answers rendered before anyone asked")
	}
	var wg sync.WaitGroup
	got := make([]*Service, 8)
	for i := range got {
		wg.Go(func() { got[i] = web.InCluster("edge-b") })
	}
	wg.Wait()
	for _, s := range got {
		if s != got[0] {
			t.Fatal("concurrent first asks rendered twice")
		}
	}
	if a := addrs(got[0].lookup("", dns.TypeA)); !slices.Equal(a, []string{"10.1.0.1"}) {
		t.Errorf("edge-b: %v", a)
	}
	if web.pods != nil || web.cfg != nil {
		t.Error("the records are kept after the split")
	}
}

// EndpointNameFits agrees with what miekg/dns can pack, at the limits.
func TestEndpointNameFits(t *testing.T) {
	r := func(c string, n int) string { return strings.Repeat(c, n) }
	for _, c := range []struct {
		host, cluster, svc string
		want               bool
	}{
		{"web-0", "edge-a", "backend", true},
		{r("h", 63), "edge-a", "backend", true},
		{r("h", 64), "edge-a", "backend", false},
		{"web-0", r("c", 100), "backend", false},                       // a valid cluster ID, one label of 100
		{r("h", 63), r("d", 50) + "." + r("e", 49), r("s", 63), false}, // 259 octets
		{r("h", 63), r("d", 50) + "." + r("e", 45), r("s", 63), true},  // 255 octets
		{r("h", 63), r("d", 50) + "." + r("e", 46), r("s", 63), false}, // 256 octets
		{"", "edge-a", "backend", false},
		{"a..b", "edge-a", "backend", false},
		{`a\046b`, "edge-a", "backend", false},
	} {
		got := EndpointNameFits(c.host, c.cluster, c.svc, "default", zone)
		name := c.host + "." + c.cluster + "." + c.svc + ".default.svc." + zone
		_, packs := dns.PackDomainName(name, make([]byte, 512), 0, nil, false)
		if got != c.want || (got && packs != nil) {
			t.Errorf("%d+%d+%d octets: %v, want %v (pack: %v)", len(c.host), len(c.cluster), len(c.svc), got, c.want, packs)
		}
	}
	if n := testing.AllocsPerRun(100, func() { EndpointNameFits("web-0", "edge-a", "backend", "default", zone) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// Any sequence of upserts, deletes and replacements leaves the incremental
// index answering exactly as an index built from scratch from the same
// records.
func TestIncrementalMatchesFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := newTable(cfg())
	clusters := []string{"edge-a", "edge-b"}
	random := func(cluster string, i int) *store.Pod {
		var ex []annotation.Export
		for s := range 3 {
			if rng.IntN(2) == 0 {
				ex = append(ex, export(fmt.Sprintf("svc-%d", s), httpPort))
			}
		}
		ip := netip.AddrFrom4([4]byte{10, byte(rng.IntN(2)), 0, byte(rng.IntN(4))})
		return pod(cluster, "default", fmt.Sprintf("p-%d", i), "", rng.IntN(4) != 0, []string{ip.String()}, ex...)
	}
	for step := range 2000 {
		c := clusters[rng.IntN(2)]
		switch r := rng.IntN(20); {
		case r == 0:
			var ps []*store.Pod
			for i := range rng.IntN(6) {
				ps = append(ps, random(c, i))
			}
			tb.ReplaceCluster(c, ps)
		case r < 6:
			tb.Delete(store.Key{Cluster: c, Namespace: "default", Name: fmt.Sprintf("p-%d", rng.IntN(6))})
		default:
			tb.Upsert(random(c, rng.IntN(6)))
		}
		if step%7 != 0 {
			continue
		}
		got := tb.Rebuild()
		fresh := newTable(cfg())
		for _, c := range clusters {
			fresh.ReplaceCluster(c, tb.Pods(c))
		}
		want := fresh.Rebuild()
		for s := range 3 {
			for _, q := range []string{fmt.Sprintf("svc-%d.default.svc.%s", s, zone), fmt.Sprintf("_http._tcp.svc-%d.default.svc.%s", s, zone)} {
				for _, qt := range []uint16{dns.TypeA, dns.TypeSRV} {
					g, w := got.Lookup(q, qt), want.Lookup(q, qt)
					if g.Kind != w.Kind || !slices.Equal(addrs(g), addrs(w)) || !slices.Equal(srvs(g), srvs(w)) {
						t.Fatalf("step %d %s %s: incremental %v %v %v, fresh %v %v %v", step, q, dns.TypeToString[qt],
							g.Kind, addrs(g), srvs(g), w.Kind, addrs(w), srvs(w))
					}
				}
			}
		}
	}
}
