package mcsannotations

import (
	"context"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
)

const (
	consumerIP = "10.240.0.5" // web/consumer: imports
	plainIP    = "10.240.0.6" // web/plain: imports nothing
	defaultIP  = "10.240.0.7" // default/local: a Pod of the services' namespace
)

func importsMCS(enforce bool) *MCS {
	m := testMCS(true)
	m.clients.Set(&clients.Client{Namespace: "web", Name: "consumer", Imports: []annotation.Import{
		{Name: "backend", Namespace: "default", Alias: "be"},
		{Name: "backend", Namespace: "default", Cluster: "edge-b", Alias: "be-b"},
		{Name: "missing", Namespace: "default", Alias: "nothere"},
	}}, []netip.Addr{netip.MustParseAddr(consumerIP)})
	m.clients.Set(&clients.Client{Namespace: "web", Name: "plain"}, []netip.Addr{netip.MustParseAddr(plainIP)})
	m.clients.Set(&clients.Client{Namespace: "default", Name: "local"}, []netip.Addr{netip.MustParseAddr(defaultIP)})
	m.enforce = enforce
	m.allow = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}
	return m
}

type clientCase struct {
	from string
	test.Case
	passed bool // handed to the next plugin
}

func runClientCases(t *testing.T, m *MCS, cases []clientCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.from+"/"+tc.Qname+"/"+dns.TypeToString[tc.Qtype], func(t *testing.T) {
			rec := dnstest.NewRecorder(&test.ResponseWriter{RemoteIP: tc.from})
			code, err := m.ServeDNS(context.Background(), rec, tc.Msg())
			if err != nil {
				t.Fatal(err)
			}
			if tc.passed {
				if code != dns.RcodeRefused || rec.Msg != nil {
					t.Fatalf("not passed on: code %d, msg %v", code, rec.Msg)
				}
				return
			}
			if rec.Msg == nil {
				t.Fatalf("passed on (code %d), want an answer", code)
			}
			if err := test.SortAndCheck(rec.Msg, tc.Case); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestAliases(t *testing.T) {
	m := importsMCS(false)
	beA := []dns.RR{test.A("be.web.svc.cluster.local. 5 IN A 10.0.0.1"), test.A("be.web.svc.cluster.local. 5 IN A 10.0.0.2")}
	runClientCases(t, m, []clientCase{
		// The importing Pod: its alias in both zones, with the import's answer.
		{from: consumerIP, Case: test.Case{Qname: "be.web.svc.cluster.local.", Qtype: dns.TypeA, Answer: beA}},
		{from: consumerIP, Case: test.Case{Qname: "be.web.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("be.web.svc.clusterset.local. 5 IN A 10.0.0.1"), test.A("be.web.svc.clusterset.local. 5 IN A 10.0.0.2")}}},
		// Limited to the import's cluster.
		{from: consumerIP, Case: test.Case{Qname: "be-b.web.svc.cluster.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("be-b.web.svc.cluster.local. 5 IN A 10.1.0.4")}}},
		{from: consumerIP, Case: test.Case{Qname: "be-b.web.svc.cluster.local.", Qtype: dns.TypeAAAA, Ns: []dns.RR{
			test.SOA("cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5")}}},
		{from: consumerIP, Case: test.Case{Qname: "_http._tcp.be.web.svc.cluster.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{
				test.SRV("_http._tcp.be.web.svc.cluster.local. 5 IN SRV 0 50 8080 10-0-0-1.edge-a.backend.default.svc.clusterset.local."),
				test.SRV("_http._tcp.be.web.svc.cluster.local. 5 IN SRV 0 50 8080 web-0.edge-a.backend.default.svc.clusterset.local."),
			},
			Extra: []dns.RR{
				test.A("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"),
				test.AAAA("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN AAAA fd00::1"),
				test.A("web-0.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
			}}},
		// Not for any other client, not in another namespace, not for other names.
		{from: plainIP, Case: test.Case{Qname: "be.web.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		{from: plainIP, Case: test.Case{Qname: "be.web.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}}},
		{from: consumerIP, Case: test.Case{Qname: "be.default.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		{from: consumerIP, Case: test.Case{Qname: "other.web.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		{from: consumerIP, Case: test.Case{Qname: "kubernetes.default.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		// An alias of a service with no ready endpoint: as if there were no alias.
		{from: consumerIP, Case: test.Case{Qname: "nothere.web.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		// Without enforce, anybody resolves any clusterset name.
		{from: "10.9.9.9", Case: test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9")}}},
	})
}

// imports enforce over services that allow no other namespace (no
// allowedNamespaces): only their own namespace and allowed CIDRs resolve them;
// an import grants nothing, and an alias to them resolves as no alias.
// access_test.go has services that allow other namespaces.
func TestImportsEnforce(t *testing.T) {
	m := importsMCS(true)
	nx := test.Case{Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}}
	refusedCase := func(q string) test.Case { c := nx; c.Qname, c.Qtype = q, dns.TypeA; return c }
	before := testutil.ToFloat64(refused.WithLabelValues("", "not_allowed")) + testutil.ToFloat64(refused.WithLabelValues("", "unknown_client"))
	runClientCases(t, m, []clientCase{
		// Imported (by any alias or none): refused all the same.
		{from: consumerIP, Case: refusedCase("backend.default.svc.clusterset.local.")},
		{from: consumerIP, Case: refusedCase("10-1-0-4.edge-b.backend.default.svc.clusterset.local.")},
		{from: consumerIP, Case: refusedCase("be-b.web.svc.clusterset.local.")},
		{from: consumerIP, Case: test.Case{Qname: "be-b.web.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
		{from: consumerIP, Case: refusedCase("db.default.svc.clusterset.local.")},
		{from: plainIP, Case: refusedCase("backend.default.svc.clusterset.local.")},
		// Its own namespace: allowed.
		{from: defaultIP, Case: test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9")}}},
		// Not a known Pod: refused unless inside an allowed CIDR.
		{from: "10.9.9.9", Case: refusedCase("db.default.svc.clusterset.local.")},
		{from: "192.168.4.4", Case: test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9")}}},
		// Names that are not service or namespace names are never refused.
		{from: "10.9.9.9", Case: test.Case{Qname: "dns-version.clusterset.local.", Qtype: dns.TypeTXT, Answer: []dns.RR{
			test.TXT(`dns-version.clusterset.local. 5 IN TXT "1.0.0"`)}}},
	})
	after := testutil.ToFloat64(refused.WithLabelValues("", "not_allowed")) + testutil.ToFloat64(refused.WithLabelValues("", "unknown_client"))
	// The two alias lookups of be-b count too (then be-b.web.svc is a name
	// of the client's own namespace: not refused, it does not exist).
	if after-before != 7 {
		t.Errorf("refused counter rose by %v, want 7", after-before)
	}
}
