package mcsannotations

import (
	"context"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcsannotations/mcsannotations/internal/table"
)

// csip is a ClusterSetIP service of the tests.
func csip(ns, name string, ips []string, ports ...table.ImportPort) table.ClusterSetIP {
	ci := table.ClusterSetIP{Namespace: ns, Name: name, Ports: ports}
	for _, ip := range ips {
		ci.IPs = append(ci.IPs, netip.MustParseAddr(ip))
	}
	return ci
}

// withClusterSetIPs gives testMCS's backend (which has endpoints) a v4-only
// ClusterSetIP with two named ports and an unnamed one, and adds vip, a
// dual-stack ClusterSetIP service with no endpoint at all.
func withClusterSetIPs(m *MCS) *MCS {
	m.table.SetClusterSetIPs([]table.ClusterSetIP{
		csip("default", "backend", []string{"10.96.0.10"},
			table.ImportPort{Name: "http", Protocol: "TCP", Port: 80},
			table.ImportPort{Name: "dns", Protocol: "UDP", Port: 53},
			table.ImportPort{Protocol: "TCP", Port: 9090}),
		csip("default", "vip", []string{"10.96.0.11", "fd00:96::11"}, table.ImportPort{Name: "grpc", Protocol: "TCP", Port: 9000}),
		csip("default", "missing", []string{"10.96.0.12"}),
	})
	m.table.Rebuild()
	return m
}

func runCases(t *testing.T, m *MCS, cases []test.Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Qname+"/"+dns.TypeToString[tc.Qtype], func(t *testing.T) {
			rec := dnstest.NewRecorder(&test.ResponseWriter{})
			if _, err := m.ServeDNS(context.Background(), rec, tc.Msg()); err != nil {
				t.Fatal(err)
			}
			if rec.Msg == nil {
				t.Fatal("no answer written")
			}
			if err := test.SortAndCheck(rec.Msg, tc); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestServeDNSClusterSetIP(t *testing.T) {
	m := withClusterSetIPs(testMCS(true))
	const be = "backend.default.svc.clusterset.local."
	nodata := []dns.RR{test.SOA(soa)}
	before := testutil.ToFloat64(answers.WithLabelValues("", "clustersetip"))
	runCases(t, m, []test.Case{
		// The ClusterSetIP, not the endpoints; case-insensitive, echoing the case asked.
		{Qname: be, Qtype: dns.TypeA, Answer: []dns.RR{test.A(be + " 5 IN A 10.96.0.10")}},
		{Qname: "BackEnd.Default.SVC.clusterset.LOCAL.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("BackEnd.Default.SVC.clusterset.LOCAL. 5 IN A 10.96.0.10")}},
		// A v4-only ClusterSetIP: AAAA is NOERROR and empty, though an endpoint has an IPv6 address.
		{Qname: be, Qtype: dns.TypeAAAA, Ns: nodata},
		{Qname: be, Qtype: dns.TypeMX, Ns: nodata},
		// A named port: one record, target the service name, its port, the ClusterSetIP in the additional section.
		{Qname: "_http._tcp." + be, Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("_http._tcp." + be + " 5 IN SRV 0 100 80 " + be)},
			Extra:  []dns.RR{test.A(be + " 5 IN A 10.96.0.10")}},
		{Qname: "_DNS._UDP.backend.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("_DNS._UDP.backend.default.svc.clusterset.local. 5 IN SRV 0 100 53 " + be)},
			Extra:  []dns.RR{test.A(be + " 5 IN A 10.96.0.10")}},
		// The bare name: one record per named port.
		{Qname: be, Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV(be + " 5 IN SRV 0 50 53 " + be), test.SRV(be + " 5 IN SRV 0 50 80 " + be)},
			Extra:  []dns.RR{test.A(be + " 5 IN A 10.96.0.10")}},
		// Unknown ports and protocols: NXDOMAIN; the protocol label: NODATA.
		{Qname: "_https._tcp." + be, Qtype: dns.TypeSRV, Rcode: dns.RcodeNameError, Ns: nodata},
		{Qname: "_http._udp." + be, Qtype: dns.TypeSRV, Rcode: dns.RcodeNameError, Ns: nodata},
		{Qname: "_tcp." + be, Qtype: dns.TypeSRV, Ns: nodata},
		// Per-endpoint names keep answering; the reserved name stays NXDOMAIN.
		{Qname: "web-0.edge-a." + be, Qtype: dns.TypeA, Answer: []dns.RR{test.A("web-0.edge-a." + be + " 5 IN A 10.0.0.2")}},
		{Qname: "edge-a." + be, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nodata},
		// A ClusterSetIP service without endpoints: answered all the same.
		{Qname: "vip.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("vip.default.svc.clusterset.local. 5 IN A 10.96.0.11")}},
		{Qname: "vip.default.svc.clusterset.local.", Qtype: dns.TypeAAAA, Answer: []dns.RR{
			test.AAAA("vip.default.svc.clusterset.local. 5 IN AAAA fd00:96::11")}},
		{Qname: "_grpc._tcp.vip.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("_grpc._tcp.vip.default.svc.clusterset.local. 5 IN SRV 0 100 9000 vip.default.svc.clusterset.local.")},
			Extra: []dns.RR{test.A("vip.default.svc.clusterset.local. 5 IN A 10.96.0.11"),
				test.AAAA("vip.default.svc.clusterset.local. 5 IN AAAA fd00:96::11")}},
		{Qname: "10-0-0-1.edge-a.vip.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nodata},
		// Services without a ServiceImport: as before.
		{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9")}},
		{Qname: "nope.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nodata},
	})
	if got := testutil.ToFloat64(answers.WithLabelValues("", "clustersetip")) - before; got != 4 {
		t.Errorf("answers_total{kind=clustersetip} rose by %v, want 4", got)
	}

	// The ServiceImport gone: headless again.
	m.table.SetClusterSetIPs(nil)
	m.table.Rebuild()
	runCases(t, m, []test.Case{
		{Qname: be, Qtype: dns.TypeA, Answer: []dns.RR{test.A(be + " 5 IN A 10.0.0.1"), test.A(be + " 5 IN A 10.0.0.2")}},
		{Qname: "vip.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nodata},
	})
}

// An alias of a ClusterSetIP service answers the ClusterSetIP, in both zones;
// an import limited to one cluster keeps that cluster's endpoints (the
// ClusterSetIP leads to every cluster's). imports enforce governs the
// ClusterSetIP name as it does the headless one.
func TestAliasesClusterSetIP(t *testing.T) {
	const be = "backend.default.svc.clusterset.local."
	m := withClusterSetIPs(importsMCS(false))
	runClientCases(t, m, []clientCase{
		{from: consumerIP, Case: test.Case{Qname: "be.web.svc.cluster.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("be.web.svc.cluster.local. 5 IN A 10.96.0.10")}}},
		{from: consumerIP, Case: test.Case{Qname: "Be.Web.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("Be.Web.svc.clusterset.local. 5 IN A 10.96.0.10")}}},
		{from: consumerIP, Case: test.Case{Qname: "be.web.svc.cluster.local.", Qtype: dns.TypeAAAA, Ns: []dns.RR{
			test.SOA("cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5")}}},
		{from: consumerIP, Case: test.Case{Qname: "_http._tcp.be.web.svc.cluster.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("_http._tcp.be.web.svc.cluster.local. 5 IN SRV 0 100 80 " + be)},
			Extra:  []dns.RR{test.A(be + " 5 IN A 10.96.0.10")}}},
		{from: consumerIP, Case: test.Case{Qname: "be-b.web.svc.cluster.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("be-b.web.svc.cluster.local. 5 IN A 10.1.0.4")}}},
		// The alias of a service with a ClusterSetIP and no endpoint.
		{from: consumerIP, Case: test.Case{Qname: "nothere.web.svc.cluster.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("nothere.web.svc.cluster.local. 5 IN A 10.96.0.12")}}},
		{from: plainIP, Case: test.Case{Qname: "be.web.svc.cluster.local.", Qtype: dns.TypeA}, passed: true},
	})

	m = withClusterSetIPs(importsMCS(true))
	nx := []dns.RR{test.SOA(soa)}
	runClientCases(t, m, []clientCase{
		// Imported, but backend allows no other namespace: refused.
		{from: consumerIP, Case: test.Case{Qname: be, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nx}},
		{from: consumerIP, Case: test.Case{Qname: "_http._tcp." + be, Qtype: dns.TypeSRV, Rcode: dns.RcodeNameError, Ns: nx}},
		{from: defaultIP, Case: test.Case{Qname: be, Qtype: dns.TypeA, Answer: []dns.RR{test.A(be + " 5 IN A 10.96.0.10")}}},
		{from: plainIP, Case: test.Case{Qname: be, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nx}},
		{from: plainIP, Case: test.Case{Qname: "vip.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nx}},
		{from: defaultIP, Case: test.Case{Qname: "vip.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("vip.default.svc.clusterset.local. 5 IN A 10.96.0.11")}}},
		{from: "10.9.9.9", Case: test.Case{Qname: be, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: nx}},
	})
}

// With ClusterSetIP services in the index, headless names cost what they did.
func BenchmarkServeDNSWithClusterSetIPs(b *testing.B) {
	m := testMCS(false)
	m.table.SetClusterSetIPs([]table.ClusterSetIP{csip("default", "vip", []string{"10.96.0.11"}, table.ImportPort{Name: "http", Protocol: "TCP", Port: 80})})
	m.table.Rebuild()
	benchServe(b, m, []benchQuery{
		{"A", "backend.default.svc.clusterset.local.", dns.TypeA},
		{"ClusterSetIP", "vip.default.svc.clusterset.local.", dns.TypeA},
		{"ClusterSetIPSRV", "_http._tcp.vip.default.svc.clusterset.local.", dns.TypeSRV},
	})
}
