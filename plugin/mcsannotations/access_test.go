package mcsannotations

import (
	"context"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// accessMCS enforces imports over: default/open (allows web), default/closed
// (allows nobody else: no field), default/split (edge-a allows web, edge-b
// does not: a service allows what all its entries allow), shared/any (allows
// "*"), and secret/vault (allows nobody else).
func accessMCS() *MCS {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a", Locality: table.Any})
	add := func(cluster, ns, name, ip, svc string, allowed ...string) {
		tb.Upsert(&store.Pod{Common: &store.Common{Cluster: cluster, Namespace: ns, Exports: []annotation.Export{{Name: svc, Namespace: ns, Cluster: cluster, Allowed: allowed}}},
			Name: name, Ready: true, IPs: []netip.Addr{netip.MustParseAddr(ip)}})
	}
	add("edge-a", "default", "o1", "10.0.0.1", "open", "web")
	add("edge-a", "default", "c1", "10.0.0.2", "closed")
	add("edge-a", "default", "s1", "10.0.0.3", "split", "web")
	add("edge-b", "default", "s2", "10.1.0.3", "split")
	add("edge-a", "shared", "a1", "10.0.1.1", "any", "*")
	add("edge-a", "secret", "v1", "10.0.2.1", "vault")
	tb.Rebuild()
	m := &MCS{zones: []string{"clusterset.local.", "cluster.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex(), enforce: true,
		Next: test.NextHandler(dns.RcodeRefused, nil)}
	// web/consumer declares imports of everything: an import grants nothing.
	m.clients.Set(&clients.Client{Namespace: "web", Name: "consumer", Imports: []annotation.Import{
		{Name: "open", Namespace: "default", Alias: "op"},
		{Name: "closed", Namespace: "default", Alias: "cl"},
		{Name: "vault", Namespace: "secret"},
	}}, []netip.Addr{netip.MustParseAddr(consumerIP)})
	m.clients.Set(&clients.Client{Namespace: "default", Name: "local"}, []netip.Addr{netip.MustParseAddr(defaultIP)})
	return m
}

// Under imports enforce the exporter decides: a service of another namespace
// resolves only when it allows the client's namespace, whatever the client
// imports; aliases to a service that does not allow it resolve as no alias.
func TestAccessByExporter(t *testing.T) {
	m := accessMCS()
	nx := func(q string) test.Case {
		return test.Case{Qname: q, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}}
	}
	a := func(q, ip string) test.Case {
		return test.Case{Qname: q, Qtype: dns.TypeA, Answer: []dns.RR{test.A(q + " 5 IN A " + ip)}}
	}
	nodata := func(q string) test.Case {
		return test.Case{Qname: q, Qtype: dns.TypeA, Ns: []dns.RR{test.SOA(soa)}}
	}
	runClientCases(t, m, []clientCase{
		{from: consumerIP, Case: a("open.default.svc.clusterset.local.", "10.0.0.1")},
		{from: consumerIP, Case: a("any.shared.svc.clusterset.local.", "10.0.1.1")},
		{from: consumerIP, Case: nx("closed.default.svc.clusterset.local.")},
		{from: consumerIP, Case: nx("split.default.svc.clusterset.local.")},
		{from: consumerIP, Case: nx("vault.secret.svc.clusterset.local.")}, // imported, not allowed
		{from: consumerIP, Case: nx("10-0-2-1.edge-a.vault.secret.svc.clusterset.local.")},
		// The client's own namespace and its own services always.
		{from: defaultIP, Case: a("closed.default.svc.clusterset.local.", "10.0.0.2")},
		{from: defaultIP, Case: nx("vault.secret.svc.clusterset.local.")},
		// Aliases: to an allowed service, answered; to another, no alias.
		{from: consumerIP, Case: a("op.web.svc.cluster.local.", "10.0.0.1")},
		{from: consumerIP, Case: test.Case{Qname: "cl.web.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		{from: consumerIP, Case: nx("cl.web.svc.clusterset.local.")},
		// Namespaces: exist for a client that may resolve something there.
		{from: consumerIP, Case: nodata("default.svc.clusterset.local.")},
		{from: consumerIP, Case: nodata("shared.svc.clusterset.local.")},
		{from: consumerIP, Case: nx("secret.svc.clusterset.local.")},
		{from: defaultIP, Case: nodata("default.svc.clusterset.local.")},
	})
}

// A refusal is indistinguishable from a name that does not exist: the same
// rcode and the same authority section, for known and unknown clients, for
// service names and for namespace names.
func TestRefusalRevealsNothing(t *testing.T) {
	m := accessMCS()
	ask := func(from, q string) *dns.Msg {
		rec := dnstest.NewRecorder(&test.ResponseWriter{RemoteIP: from})
		req := new(dns.Msg)
		req.SetQuestion(q, dns.TypeA)
		if _, err := m.ServeDNS(context.Background(), rec, req); err != nil || rec.Msg == nil {
			t.Fatalf("%s from %s: no answer (%v)", q, from, err)
		}
		return rec.Msg
	}
	same := func(from, refused, missing string) {
		t.Helper()
		a, b := ask(from, refused), ask(from, missing)
		if a.Rcode != b.Rcode || len(a.Answer) != len(b.Answer) || len(a.Ns) != len(b.Ns) || len(a.Ns) != 1 || a.Ns[0].String() != b.Ns[0].String() || a.Rcode != dns.RcodeNameError {
			t.Errorf("from %s: %s answers\n%v\nbut %s (does not exist)\n%v", from, refused, a, missing, b)
		}
	}
	for _, from := range []string{consumerIP, "10.9.9.9"} {
		same(from, "secret.svc.clusterset.local.", "unused.svc.clusterset.local.")
		same(from, "vault.secret.svc.clusterset.local.", "nothing.unused.svc.clusterset.local.")
	}
	same("10.9.9.9", "default.svc.clusterset.local.", "unused.svc.clusterset.local.")
	same(consumerIP, "closed.default.svc.clusterset.local.", "nothing.default.svc.clusterset.local.")
}
