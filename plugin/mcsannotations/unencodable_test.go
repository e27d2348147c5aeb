package mcsannotations

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// An endpoint whose name cannot be encoded (a 100-character cluster ID: a
// valid Kubernetes subdomain, but one label of 100 octets; or a 63-character
// hostname in a cluster of a dotted 100-character ID under a 63-character
// service name: 259 octets) is left out of SRV answers
// and has no endpoint name; its addresses still answer the service name, and
// every other endpoint answers as before. Every reply packs (dig refused the
// whole reply before).
func TestUnencodableEndpointNames(t *testing.T) {
	longCluster := strings.Repeat("c", 100)
	dotted := strings.Repeat("d", 50) + "." + strings.Repeat("e", 49) // 100 characters in labels that fit
	longHost := strings.Repeat("h", 63)
	longSvc := strings.Repeat("s", 63)
	const longNS = "default"
	http := annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a", Locality: table.Any})
	var reported []string
	tb.OnUnencodable(func(p *store.Pod, e annotation.Export) {
		reported = append(reported, p.Name+"/"+e.Name)
		logUnencodable(p, e)
	})
	before := testutil.ToFloat64(unencodableNames.WithLabelValues(longCluster)) + testutil.ToFloat64(unencodableNames.WithLabelValues(dotted))
	add := func(cluster, name, hostname, ip, svc string) {
		p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: longNS, Exports: []annotation.Export{
			{Name: svc, Namespace: longNS, Cluster: cluster, Ports: []annotation.Port{http}}}},
			Name: name, Hostname: hostname, Ready: true, IPs: []netip.Addr{netip.MustParseAddr(ip)}}
		tb.Upsert(p)
	}
	add("edge-a", "good", "", "10.0.0.1", "backend")
	add(longCluster, "far", "", "10.9.0.1", "backend")
	add("edge-a", "good2", "", "10.0.0.2", longSvc)
	add(dotted, "long", longHost, "10.0.0.3", longSvc)
	tb.Rebuild()
	m := &MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}

	fqdn := longSvc + ".default.svc.clusterset.local."
	cases := []test.Case{
		{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("backend.default.svc.clusterset.local. 5 IN SRV 0 100 8080 10-0-0-1.edge-a.backend.default.svc.clusterset.local.")},
			Extra:  []dns.RR{test.A("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.1")}},
		{Qname: "_http._tcp.backend.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("_http._tcp.backend.default.svc.clusterset.local. 5 IN SRV 0 100 8080 10-0-0-1.edge-a.backend.default.svc.clusterset.local.")},
			Extra:  []dns.RR{test.A("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.1")}},
		// Its address still answers the service name.
		{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"), test.A("backend.default.svc.clusterset.local. 5 IN A 10.9.0.1")}},
		{Qname: fqdn, Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV(fqdn + " 5 IN SRV 0 100 8080 10-0-0-2.edge-a." + fqdn)},
			Extra:  []dns.RR{test.A("10-0-0-2.edge-a." + fqdn + " 5 IN A 10.0.0.2")}},
		{Qname: fqdn, Qtype: dns.TypeA, Answer: []dns.RR{test.A(fqdn + " 5 IN A 10.0.0.2"), test.A(fqdn + " 5 IN A 10.0.0.3")}},
		{Qname: "10-0-0-2.edge-a." + fqdn, Qtype: dns.TypeA, Answer: []dns.RR{test.A("10-0-0-2.edge-a." + fqdn + " 5 IN A 10.0.0.2")}},
	}
	for _, tc := range cases {
		t.Run(tc.Qname[:min(len(tc.Qname), 40)]+"/"+dns.TypeToString[tc.Qtype], func(t *testing.T) {
			rec := dnstest.NewRecorder(&test.ResponseWriter{})
			if _, err := m.ServeDNS(context.Background(), rec, tc.Msg()); err != nil {
				t.Fatal(err)
			}
			if err := test.SortAndCheck(rec.Msg, tc); err != nil {
				t.Error(err)
			}
			if _, err := rec.Msg.Pack(); err != nil {
				t.Errorf("the reply does not pack: %v", err)
			}
		})
	}
	if len(reported) != 2 {
		t.Errorf("reported %v, want far/backend and long/%s once each", reported, longSvc)
	}
	after := testutil.ToFloat64(unencodableNames.WithLabelValues(longCluster)) + testutil.ToFloat64(unencodableNames.WithLabelValues(dotted))
	if after-before != 2 {
		t.Errorf("unencodable_names_total rose by %v, want 2", after-before)
	}
	// The same records again are no change: not reported again.
	add(dotted, "long", longHost, "10.0.0.3", longSvc)
	if len(reported) != 2 {
		t.Errorf("an unchanged record was reported again: %v", reported)
	}
}
