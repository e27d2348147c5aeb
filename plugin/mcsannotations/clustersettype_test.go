package mcsannotations

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// typedMCS is the handler over a table (TTL 30) of: web, exported as
// ClusterSetIP by edge-a (two Pods) and edge-b (one), with the ports http
// (80, Pods listen on 8080) and grpc (9000); old, whose entries predate the
// type (Headless); hl, exported as Headless; and mixed, exported as
// ClusterSetIP by edge-a and as Headless by edge-b, whose export is older.
func typedMCS() *MCS {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 30, LocalCluster: "edge-a"})
	http := annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
	grpc := annotation.Port{Name: "grpc", Port: 9000, TargetPort: 9000, Protocol: "TCP"}
	typed := func(name, typ, at string, ports ...annotation.Port) annotation.Export {
		return annotation.Export{Name: name, Ports: ports, Service: annotation.Service{Type: typ, ExportedAt: at}}
	}
	addPod(tb, "edge-a", "w1", "web-0", true, []string{"10.0.0.1"}, typed("web", annotation.TypeClusterSetIP, "2026-11-25T10:00:00Z", http, grpc))
	addPod(tb, "edge-a", "w2", "", true, []string{"10.0.0.2"}, typed("web", annotation.TypeClusterSetIP, "2026-11-25T10:00:00Z", http, grpc))
	addPod(tb, "edge-b", "w3", "", true, []string{"10.1.0.3"}, typed("web", annotation.TypeClusterSetIP, "2026-11-25T11:00:00Z", http, grpc))
	addPod(tb, "edge-a", "o1", "", true, []string{"10.0.0.5"}, annotation.Export{Name: "old", Ports: []annotation.Port{http}})
	addPod(tb, "edge-a", "h1", "", true, []string{"10.0.0.6"}, typed("hl", annotation.TypeHeadless, "", http))
	addPod(tb, "edge-a", "m1", "", true, []string{"10.0.0.7"}, typed("mixed", annotation.TypeClusterSetIP, "2026-11-25T11:00:00Z", http))
	addPod(tb, "edge-b", "m2", "", true, []string{"10.1.0.7"}, typed("mixed", annotation.TypeHeadless, "2026-11-25T10:00:00Z", http))
	tb.Rebuild()
	return &MCS{zones: []string{"clusterset.local.", "cluster.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}
}

const (
	web      = "web.default.svc.clusterset.local."
	typedSOA = "clusterset.local.	30	IN	SOA	ns.dns.clusterset.local. hostmaster.clusterset.local. 1 7200 1800 86400 30"
	// pendingSOA: the negative TTL of a ClusterSetIP not known yet.
	pendingSOA = "clusterset.local.	5	IN	SOA	ns.dns.clusterset.local. hostmaster.clusterset.local. 1 7200 1800 86400 5"
)

// The names every state answers alike: endpoint names of a ClusterSetIP
// service, and services that are not exported as ClusterSetIP (old entries
// without a type, Headless ones, and one whose oldest export is Headless).
var typedAlways = []test.Case{
	{Qname: "web-0.edge-a." + web, Qtype: dns.TypeA, Answer: []dns.RR{test.A("web-0.edge-a." + web + " 30 IN A 10.0.0.1")}},
	{Qname: "edge-a." + web, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(typedSOA)}},
	{Qname: "old.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("old.default.svc.clusterset.local. 30 IN A 10.0.0.5")}},
	{Qname: "_http._tcp.old.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
		Answer: []dns.RR{test.SRV("_http._tcp.old.default.svc.clusterset.local. 30 IN SRV 0 100 8080 10-0-0-5.edge-a.old.default.svc.clusterset.local.")},
		Extra:  []dns.RR{test.A("10-0-0-5.edge-a.old.default.svc.clusterset.local. 30 IN A 10.0.0.5")}},
	{Qname: "hl.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
		Answer: []dns.RR{test.SRV("hl.default.svc.clusterset.local. 30 IN SRV 0 100 8080 10-0-0-6.edge-a.hl.default.svc.clusterset.local.")},
		Extra:  []dns.RR{test.A("10-0-0-6.edge-a.hl.default.svc.clusterset.local. 30 IN A 10.0.0.6")}},
	{Qname: "mixed.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("mixed.default.svc.clusterset.local. 30 IN A 10.0.0.7")}},
}

func runTyped(t *testing.T, m *MCS, cases []test.Case) {
	t.Helper()
	runCases(t, m, append(cases, typedAlways...))
}

// (a) The ClusterSetIP known: the ClusterSetIP, SRV in service form.
func TestClusterSetIPTypeKnown(t *testing.T) {
	for _, state := range []table.ImportState{table.ImportsServed, table.ImportsAbsent, table.ImportsUnknown} {
		t.Run(state.String(), func(t *testing.T) {
			m := typedMCS()
			m.table.SetImportState(state)
			m.table.SetClusterSetIPs([]table.ClusterSetIP{csip("default", "web", []string{"10.96.0.10"},
				table.ImportPort{Name: "http", Protocol: "TCP", Port: 80}, table.ImportPort{Name: "grpc", Protocol: "TCP", Port: 9000})})
			m.table.Rebuild()
			runTyped(t, m, []test.Case{
				{Qname: web, Qtype: dns.TypeA, Answer: []dns.RR{test.A(web + " 30 IN A 10.96.0.10")}},
				{Qname: "_http._tcp." + web, Qtype: dns.TypeSRV,
					Answer: []dns.RR{test.SRV("_http._tcp." + web + " 30 IN SRV 0 100 80 " + web)},
					Extra:  []dns.RR{test.A(web + " 30 IN A 10.96.0.10")}},
				{Qname: web, Qtype: dns.TypeSRV,
					Answer: []dns.RR{test.SRV(web + " 30 IN SRV 0 50 80 " + web), test.SRV(web + " 30 IN SRV 0 50 9000 " + web)},
					Extra:  []dns.RR{test.A(web + " 30 IN A 10.96.0.10")}},
			})
		})
	}
}

// (b) ServiceImports served (or not known yet), no ClusterSetIP: NODATA with
// a short negative TTL at the service and port names, never the Pods'.
func TestClusterSetIPTypePending(t *testing.T) {
	pending := []dns.RR{test.SOA(pendingSOA)}
	for _, state := range []table.ImportState{table.ImportsServed, table.ImportsUnknown} {
		t.Run(state.String(), func(t *testing.T) {
			m := typedMCS()
			m.table.SetImportState(state)
			m.table.Rebuild()
			before := testutil.ToFloat64(answers.WithLabelValues("", "clustersetip_pending"))
			runTyped(t, m, []test.Case{
				{Qname: web, Qtype: dns.TypeA, Ns: pending},
				{Qname: "WEB.default.svc.clusterset.local.", Qtype: dns.TypeAAAA, Ns: []dns.RR{test.SOA(pendingSOA)}},
				{Qname: web, Qtype: dns.TypeSRV, Ns: pending},
				{Qname: "_http._tcp." + web, Qtype: dns.TypeSRV, Ns: pending},
				{Qname: "_tcp." + web, Qtype: dns.TypeSRV, Ns: pending},
				{Qname: "_nope._tcp." + web, Qtype: dns.TypeSRV, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(typedSOA)}},
			})
			if got := testutil.ToFloat64(answers.WithLabelValues("", "clustersetip_pending")) - before; got != 5 {
				t.Errorf("answers_total{kind=clustersetip_pending} rose by %v, want 5", got)
			}
			// The negative TTL is the SOA's TTL or minimum, whichever is less.
			rec := dnstest.NewRecorder(&test.ResponseWriter{})
			if _, err := m.ServeDNS(context.Background(), rec, (&test.Case{Qname: web, Qtype: dns.TypeA}).Msg()); err != nil {
				t.Fatal(err)
			}
			if soa, ok := rec.Msg.Ns[0].(*dns.SOA); !ok || soa.Minttl != pendingTTL || soa.Hdr.Ttl != pendingTTL {
				t.Errorf("authority %v, want an SOA with TTL and minimum %d", rec.Msg.Ns, pendingTTL)
			}
			// Logged once per service.
			m.pendingMu.Lock()
			if len(m.pendingLogged) != 1 {
				t.Errorf("logged %v, want web alone", m.pendingLogged)
			}
			m.pendingMu.Unlock()
		})
	}
}

// (c) No ServiceImports served: the endpoints' addresses, SRV in service form
// (the port the endpoints listen on), no endpoint-form targets.
func TestClusterSetIPTypeNoController(t *testing.T) {
	m := typedMCS()
	m.table.SetImportState(table.ImportsAbsent)
	m.table.Rebuild()
	runTyped(t, m, []test.Case{
		{Qname: web, Qtype: dns.TypeA, Answer: []dns.RR{test.A(web + " 30 IN A 10.0.0.1"), test.A(web + " 30 IN A 10.0.0.2")}},
		{Qname: "_http._tcp." + web, Qtype: dns.TypeSRV, Answer: []dns.RR{test.SRV("_http._tcp." + web + " 30 IN SRV 0 100 8080 " + web)}},
		{Qname: web, Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV(web + " 30 IN SRV 0 50 8080 " + web), test.SRV(web + " 30 IN SRV 0 50 9000 " + web)}},
		{Qname: "_tcp." + web, Qtype: dns.TypeSRV, Ns: []dns.RR{test.SOA(typedSOA)}},
		{Qname: "_nope._tcp." + web, Qtype: dns.TypeSRV, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(typedSOA)}},
	})
	// The CRD installed later: pending from the next index on.
	m.table.SetImportState(table.ImportsServed)
	m.table.Rebuild()
	runCases(t, m, []test.Case{{Qname: web, Qtype: dns.TypeA, Ns: []dns.RR{test.SOA(pendingSOA)}}})
}

// An alias of a ClusterSetIP service answers as its service name does; one
// limited to a cluster keeps that cluster's endpoints.
func TestClusterSetIPTypeAlias(t *testing.T) {
	m := typedMCS()
	m.table.SetImportState(table.ImportsServed)
	m.table.Rebuild()
	ix := m.table.Index()
	if a := ix.LookupService("default", "web", "", "", dns.TypeA); a.Kind != table.KindPendingClusterSetIP {
		t.Errorf("alias: %v, want clustersetip_pending", a.Kind)
	}
	if a := ix.LookupService("default", "web", "edge-b", "", dns.TypeA); a.Kind != table.KindService || len(a.A) != 1 {
		t.Errorf("alias limited to edge-b: %v %v, want its endpoint", a.Kind, a.A)
	}
	if a := ix.LookupService("default", "old", "", "", dns.TypeA); a.Kind != table.KindService {
		t.Errorf("alias of an untyped service: %v", a.Kind)
	}
}

// After a restart from the snapshot with every API server unreachable, a
// service exported as ClusterSetIP answers as it did before: the endpoints'
// addresses and service-form SRV where no ServiceImports were served, NODATA
// with the short negative TTL where they were (its type, and whether they
// were served, both come from the snapshot).
func TestClusterSetIPTypeAfterOfflineRestart(t *testing.T) {
	for _, state := range []table.ImportState{table.ImportsAbsent, table.ImportsServed} {
		t.Run(state.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "table.db")
			st, _, err := snapshot.Open(path, snapshot.Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := snapshot.EncodePod(&store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{
				Name: "web", Namespace: "default", Cluster: "edge-a",
				Ports:   []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}},
				Service: annotation.Service{Type: annotation.TypeClusterSetIP}}}},
				Name: "web-1", Ready: true, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
			if err != nil {
				t.Fatal(err)
			}
			st.ReplaceSource("edge-a", map[string][]byte{"default/web-1": b}, snapshot.Meta{ClusterID: "edge-a"})
			st.ReplaceImports(nil, state)
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			withClient(t, deadAPI)
			withDynamic(t, deadDynamic)
			i, udp, _ := serveSnapshot(t, path)
			defer stopServer(i)
			a := exchange(t, "udp", udp, web, dns.TypeA, 0)
			srv := exchange(t, "udp", udp, "_http._tcp."+web, dns.TypeSRV, 0)
			if state == table.ImportsAbsent {
				if got := addrsOf(a); !slices.Equal(got, []string{"10.0.0.1"}) {
					t.Errorf("A: %v, want the endpoint", a)
				}
				if len(srv.Answer) != 1 || srv.Answer[0].(*dns.SRV).Target != web || srv.Answer[0].(*dns.SRV).Port != 8080 {
					t.Errorf("SRV: %v, want 8080 %s", srv, web)
				}
				return
			}
			for _, m := range []*dns.Msg{a, srv} {
				if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 || len(m.Ns) != 1 || m.Ns[0].Header().Ttl != pendingTTL {
					t.Errorf("%v, want NODATA with TTL %d", m, pendingTTL)
				}
			}
		})
	}
}
