package mcsannotations

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// Issue 4, performance: do peers cost the query path anything? Each source
// (cluster) holds the same data: 10,000 services of 2 ready endpoints in 100
// namespaces. sources=1 is edge-a alone; sources=3 adds edge-b and edge-c,
// whose services have names of their own, so that every answer compared has
// the same size (2 endpoints), and the difference is only the table's size
// and its number of clusters. shared=3 has the three sources export the same
// 10,000 names (the clusterset case): prefer-local answers edge-a's 2
// endpoints, as with one source (any would answer 6, so it is not compared).
// The sources= part of the name is the column to compare:
//
//	go test -run '^$' -bench Sources -benchmem -count 5 ./plugin/mcsannotations/ >out.txt
//	benchstat -col /sources out.txt

const (
	benchServices = 10000
	benchPerSvc   = 2
)

var benchClusters = []string{"edge-a", "edge-b", "edge-c"}

// sourcePods is one cluster's Pods: services named <prefix>svc-<i>.
func sourcePods(cluster int, prefix string) []*store.Pod {
	name := benchClusters[cluster]
	http := annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
	pods := make([]*store.Pod, 0, benchServices*benchPerSvc)
	for s := range benchServices {
		ns := fmt.Sprintf("ns-%d", s%100)
		for e := range benchPerSvc {
			i := s*benchPerSvc + e
			pods = append(pods, &store.Pod{Common: &store.Common{Cluster: name, Namespace: ns, Exports: []annotation.Export{{Name: fmt.Sprintf("%ssvc-%d", prefix, s), Namespace: ns, Cluster: name,
				Ports: []annotation.Port{http}}}}, Name: fmt.Sprintf("pod-%d", i),
				IPs:   []netip.Addr{netip.AddrFrom4([4]byte{10, byte(cluster), byte(i >> 8), byte(i)})},
				Ready: true})
		}
	}
	return pods
}

// sourcesMCS is the handler over sources clusters; with shared, every
// cluster exports the same names, else cluster k's are prefixed "c<k>-"
// (edge-a's have no prefix in both cases).
func sourcesMCS(sources int, shared bool, loc table.Locality) *MCS {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a", Locality: loc})
	for k := range sources {
		prefix := ""
		if k > 0 && !shared {
			prefix = fmt.Sprintf("c%d-", k)
		}
		tb.ReplaceCluster(benchClusters[k], sourcePods(k, prefix))
	}
	tb.Rebuild()
	return &MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}
}

// benchColumn is one configuration compared.
type benchColumn struct {
	name  string // the sources= value: a column for benchstat -col /sources
	m     *MCS
	qname string
}

func BenchmarkSources(b *testing.B) {
	// Service 5050 is in namespace ns-50; edge-b's is c1-svc-5050.
	const local, peer = "svc-5050.ns-50.svc.clusterset.local.", "c1-svc-5050.ns-50.svc.clusterset.local."
	for _, loc := range []table.Locality{table.PreferLocal, table.Any} {
		one, three := sourcesMCS(1, false, loc), sourcesMCS(3, false, loc)
		cols := []benchColumn{
			{"1", one, local},
			{"3", three, local},     // edge-a's service among three sources
			{"3-peer", three, peer}, // edge-b's service among three sources
		}
		if loc == table.PreferLocal {
			// Any would answer 6 endpoints here: not the same answer.
			cols = append(cols, benchColumn{"3-shared", sourcesMCS(3, true, loc), local})
		}
		for _, q := range []struct {
			name   string
			prefix string
			qtype  uint16
		}{{"A", "", dns.TypeA}, {"SRV", "_http._tcp.", dns.TypeSRV}} {
			for _, c := range cols {
				b.Run(fmt.Sprintf("loc=%s/q=%s/sources=%s", loc, q.name, c.name), func(b *testing.B) {
					req := (&test.Case{Qname: q.prefix + c.qname, Qtype: q.qtype}).Msg()
					ctx := context.Background()
					rec := dnstest.NewRecorder(&test.ResponseWriter{})
					c.m.ServeDNS(ctx, rec, req)
					if rec.Msg == nil || rec.Msg.Rcode != dns.RcodeSuccess || len(rec.Msg.Answer) != benchPerSvc {
						b.Fatalf("%s: want %d answers, got %v", req.Question[0].Name, benchPerSvc, rec.Msg)
					}
					w := &test.ResponseWriter{}
					b.ReportAllocs()
					for b.Loop() {
						c.m.ServeDNS(ctx, w, req)
					}
				})
			}
		}
	}
}

// BenchmarkSourcesPaired answers the same question from one source and from
// three in alternating blocks of 256 queries, so that the load of a shared
// machine falls on both alike, and reports each one's ns per answer and
// their ratio (3/1; 1.00 means no cost).
func BenchmarkSourcesPaired(b *testing.B) {
	const local = "svc-5050.ns-50.svc.clusterset.local."
	const block = 256
	for _, loc := range []table.Locality{table.PreferLocal, table.Any} {
		one, three := sourcesMCS(1, false, loc), sourcesMCS(3, false, loc)
		for _, q := range []struct {
			name  string
			qname string
			qtype uint16
		}{{"A", local, dns.TypeA}, {"SRV", "_http._tcp." + local, dns.TypeSRV}} {
			b.Run(fmt.Sprintf("loc=%s/q=%s", loc, q.name), func(b *testing.B) {
				req := (&test.Case{Qname: q.qname, Qtype: q.qtype}).Msg()
				ctx := context.Background()
				w := &test.ResponseWriter{}
				var t1, t3 time.Duration
				n := 0
				for b.Loop() {
					pair := []struct {
						m *MCS
						t *time.Duration
					}{{one, &t1}, {three, &t3}}
					if n%(2*block) != 0 { // every other round, three first
						pair[0], pair[1] = pair[1], pair[0]
					}
					for _, s := range pair {
						start := time.Now()
						for range block {
							s.m.ServeDNS(ctx, w, req)
						}
						*s.t += time.Since(start)
					}
					n += block
				}
				b.ReportMetric(float64(t1.Nanoseconds())/float64(n), "ns/answer-1")
				b.ReportMetric(float64(t3.Nanoseconds())/float64(n), "ns/answer-3")
				b.ReportMetric(float64(t3)/float64(t1), "ratio-3/1")
			})
		}
	}
}
