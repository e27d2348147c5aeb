package mcsannotations

import (
	"context"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/pkg/fall"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

const soa = "clusterset.local.	5	IN	SOA	ns.dns.clusterset.local. hostmaster.clusterset.local. 1 7200 1800 86400 5"

// testTable is a record store and the DNS table over it, for tests that make
// an MCS by hand: they write records to the store.
type testTable struct {
	*store.Store
	*table.Table
}

func newTable(cfg table.Config) testTable {
	st := store.New()
	return testTable{st, table.New(cfg, st)}
}

// addPod writes a record of a Pod in namespace default to w.
func addPod(w interface{ Upsert(*store.Pod) }, cluster, name, hostname string, ready bool, ips []string, exports ...annotation.Export) {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: "default"}, Name: name, Hostname: hostname, Ready: ready}
	for _, ip := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(ip))
	}
	for _, e := range exports {
		e.Namespace, e.Cluster = "default", cluster
		p.Exports = append(p.Exports, e)
	}
	w.Upsert(p)
}

// testMCS is the handler over a table of: backend (two ready Pods in edge-a,
// one not ready, one in edge-b), db (only in edge-b), and a Pod backing two
// services.
func testMCS(next bool) *MCS {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
	http := annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
	addPod(tb, "edge-a", "b1", "", true, []string{"10.0.0.1", "fd00::1"}, annotation.Export{Name: "backend", Ports: []annotation.Port{http}})
	addPod(tb, "edge-a", "b2", "web-0", true, []string{"10.0.0.2"}, annotation.Export{Name: "backend", Ports: []annotation.Port{http}}, annotation.Export{Name: "metrics"})
	addPod(tb, "edge-a", "b3", "", false, []string{"10.0.0.3"}, annotation.Export{Name: "backend", Ports: []annotation.Port{http}})
	addPod(tb, "edge-b", "b4", "", true, []string{"10.1.0.4"}, annotation.Export{Name: "backend", Ports: []annotation.Port{http}})
	addPod(tb, "edge-b", "d1", "", true, []string{"10.1.0.9"}, annotation.Export{Name: "db", Ports: []annotation.Port{{Name: "pg", Port: 5432, TargetPort: 5432, Protocol: "TCP"}}})
	tb.Rebuild()
	m := &MCS{zones: []string{"clusterset.local.", "cluster.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}
	if next {
		m.Next = test.NextHandler(dns.RcodeRefused, nil) // marks "passed on"
	}
	return m
}

func TestServeDNS(t *testing.T) {
	m := testMCS(true)
	cases := []test.Case{
		{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"),
			test.A("backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
		}},
		// Case-insensitive; the answer echoes the name as asked.
		{Qname: "BackEnd.Default.SVC.clusterset.LOCAL.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("BackEnd.Default.SVC.clusterset.LOCAL. 5 IN A 10.0.0.1"),
			test.A("BackEnd.Default.SVC.clusterset.LOCAL. 5 IN A 10.0.0.2"),
		}},
		{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeAAAA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.AAAA("backend.default.svc.clusterset.local. 5 IN AAAA fd00::1"),
		}},
		{Qname: "_http._tcp.backend.default.svc.clusterset.local.", Qtype: dns.TypeSRV, Rcode: dns.RcodeSuccess,
			Answer: []dns.RR{
				test.SRV("_http._tcp.backend.default.svc.clusterset.local. 5 IN SRV 0 50 8080 10-0-0-1.edge-a.backend.default.svc.clusterset.local."),
				test.SRV("_http._tcp.backend.default.svc.clusterset.local. 5 IN SRV 0 50 8080 web-0.edge-a.backend.default.svc.clusterset.local."),
			},
			Extra: []dns.RR{
				test.A("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"),
				test.AAAA("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN AAAA fd00::1"),
				test.A("web-0.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
			}},
		{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeSRV, Rcode: dns.RcodeSuccess,
			Answer: []dns.RR{
				test.SRV("backend.default.svc.clusterset.local. 5 IN SRV 0 50 8080 10-0-0-1.edge-a.backend.default.svc.clusterset.local."),
				test.SRV("backend.default.svc.clusterset.local. 5 IN SRV 0 50 8080 web-0.edge-a.backend.default.svc.clusterset.local."),
			},
			Extra: []dns.RR{
				test.A("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"),
				test.AAAA("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN AAAA fd00::1"),
				test.A("web-0.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
			}},
		// Only in a peer: the peer's endpoints.
		{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9"),
		}},
		{Qname: "metrics.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("metrics.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
		}},
		{Qname: "10-1-0-4.edge-b.backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("10-1-0-4.edge-b.backend.default.svc.clusterset.local. 5 IN A 10.1.0.4"),
		}},
		{Qname: "web-0.edge-a.backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("web-0.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
		}},
		// Reserved <clusterid>.<svc>.<ns>: NXDOMAIN.
		{Qname: "edge-a.backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}},
		// A not-ready Pod has no name.
		{Qname: "10-0-0-3.edge-a.backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}},
		{Qname: "nope.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}},
		// Known name, other type: NODATA.
		{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeMX, Rcode: dns.RcodeSuccess, Ns: []dns.RR{test.SOA(soa)}},
		{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeAAAA, Rcode: dns.RcodeSuccess, Ns: []dns.RR{test.SOA(soa)}},
		{Qname: "default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Ns: []dns.RR{test.SOA(soa)}},
		{Qname: "dns-version.clusterset.local.", Qtype: dns.TypeTXT, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.TXT(`dns-version.clusterset.local. 5 IN TXT "1.0.0"`),
		}},
		{Qname: "clusterset.local.", Qtype: dns.TypeSOA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{test.SOA(soa)}},
		{Qname: "clusterset.local.", Qtype: dns.TypeNS, Rcode: dns.RcodeSuccess,
			Answer: []dns.RR{test.NS("clusterset.local. 5 IN NS ns.dns.clusterset.local.")},
			Extra:  []dns.RR{test.A("ns.dns.clusterset.local. 5 IN A 127.0.0.1")}},
		{Qname: "ns.dns.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeSuccess, Answer: []dns.RR{
			test.A("ns.dns.clusterset.local. 5 IN A 127.0.0.1"),
		}},
		{Qname: "ns.dns.clusterset.local.", Qtype: dns.TypeAAAA, Rcode: dns.RcodeSuccess, Ns: []dns.RR{test.SOA(soa)}},
		// Other zones, and the alias zone: passed on untouched.
		{Qname: "backend.default.svc.cluster.local.", Qtype: dns.TypeA, Rcode: dns.RcodeRefused},
		{Qname: "example.org.", Qtype: dns.TypeA, Rcode: dns.RcodeRefused},
	}
	for _, tc := range cases {
		t.Run(tc.Qname+"/"+dns.TypeToString[tc.Qtype], func(t *testing.T) {
			rec := dnstest.NewRecorder(&test.ResponseWriter{})
			code, err := m.ServeDNS(context.Background(), rec, tc.Msg())
			if err != nil {
				t.Fatal(err)
			}
			if tc.Rcode == dns.RcodeRefused { // passed to next: we wrote nothing
				if code != dns.RcodeRefused || rec.Msg != nil {
					t.Fatalf("not passed on: code %d, msg %v", code, rec.Msg)
				}
				return
			}
			if rec.Msg == nil {
				t.Fatal("no answer written")
			}
			if !rec.Msg.Authoritative {
				t.Error("answer not authoritative")
			}
			if err := test.SortAndCheck(rec.Msg, tc); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestServeDNSFallthrough(t *testing.T) {
	m := testMCS(true)
	m.fall = fall.Root
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	code, _ := m.ServeDNS(context.Background(), rec, (&test.Case{Qname: "nope.default.svc.clusterset.local.", Qtype: dns.TypeA}).Msg())
	if code != dns.RcodeRefused || rec.Msg != nil {
		t.Fatalf("NXDOMAIN did not fall through: code %d", code)
	}
	// Names that exist are still answered.
	rec = dnstest.NewRecorder(&test.ResponseWriter{})
	m.ServeDNS(context.Background(), rec, (&test.Case{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeA}).Msg())
	if rec.Msg == nil || len(rec.Msg.Answer) != 2 {
		t.Fatalf("existing name not answered: %v", rec.Msg)
	}
}

// The handler hands out copies: a later plugin that rewrites or shuffles the
// answer cannot corrupt the index.
func TestServeDNSCopiesRecords(t *testing.T) {
	m := testMCS(false)
	q := (&test.Case{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeA}).Msg()
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	m.ServeDNS(context.Background(), rec, q)
	for _, rr := range rec.Msg.Answer {
		rr.Header().Name = "hijacked."
		rr.(*dns.A).A[0] = 99 // also the IP bytes: they must not be shared
	}
	rec = dnstest.NewRecorder(&test.ResponseWriter{})
	m.ServeDNS(context.Background(), rec, q)
	for _, rr := range rec.Msg.Answer {
		if rr.Header().Name != "backend.default.svc.clusterset.local." || rr.(*dns.A).A[0] != 10 {
			t.Fatalf("index corrupted through a response: %v", rr)
		}
	}
}

func BenchmarkServeDNS(b *testing.B) {
	benchServe(b, testMCS(false), []benchQuery{
		{"A", "backend.default.svc.clusterset.local.", dns.TypeA},
		{"SRV", "_http._tcp.backend.default.svc.clusterset.local.", dns.TypeSRV},
		{"NXDOMAIN", "nope.default.svc.clusterset.local.", dns.TypeA},
	})
}

type benchQuery struct {
	name, qname string
	qtype       uint16
}

// benchServe runs ServeDNS on m for each query as a sub-benchmark.
func benchServe(b *testing.B, m *MCS, qs []benchQuery) {
	for _, q := range qs {
		b.Run(q.name, func(b *testing.B) {
			req := (&test.Case{Qname: q.qname, Qtype: q.qtype}).Msg()
			w := &test.ResponseWriter{}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				m.ServeDNS(ctx, w, req)
			}
		})
	}
}

func TestZoneOf(t *testing.T) {
	m := &MCS{zones: []string{"clusterset.local.", "cluster.local.", "sub.cluster.local."}}
	for q, want := range map[string]string{
		"clusterset.local.":                  "clusterset.local.",
		"a.b.svc.clusterset.local.":          "clusterset.local.",
		"a.cluster.local.":                   "cluster.local.",
		"a.sub.cluster.local.":               "sub.cluster.local.",
		"xcluster.local.":                    "",
		"local.":                             "",
		"example.org.":                       "",
		"a.b.svc.clusterset.local.evil.org.": "",
	} {
		if got := m.zoneOf(q); got != want {
			t.Errorf("zoneOf(%q) = %q, want %q", q, got, want)
		}
	}
	root := &MCS{zones: []string{"."}}
	if root.zoneOf("anything.") != "." {
		t.Error("root zone")
	}
}
