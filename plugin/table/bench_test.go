package table

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/plugin/annotation"
)

// benchPods makes n Pods backing n/10 services (10 endpoints each) in 50
// namespaces, with one named port.
func benchPods(n int) []*Pod {
	pods := make([]*Pod, n)
	for i := range pods {
		ns := fmt.Sprintf("ns-%d", i%50)
		pods[i] = &Pod{Cluster: "edge-a", Namespace: ns, Name: fmt.Sprintf("pod-%d", i), UID: fmt.Sprintf("8f0c1b2e-0000-4000-8000-%012d", i),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}, Ready: true,
			Exports: []annotation.Export{{Name: fmt.Sprintf("svc-%d", i/10), Namespace: ns, Cluster: "edge-a",
				Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}}}
	}
	return pods
}

// BenchmarkColdLoad is the table's part of a cold start from a snapshot of
// 100,000 endpoints: decode every record, load them, build the index, answer.
func BenchmarkColdLoad(b *testing.B) {
	pods := benchPods(100000)
	recs := make([][]byte, len(pods))
	for i, p := range pods {
		recs[i], _ = EncodePod(p)
	}
	b.ResetTimer()
	for b.Loop() {
		decoded := make([]*Pod, len(recs))
		for i, r := range recs {
			p, err := DecodePod(r)
			if err != nil {
				b.Fatal(err)
			}
			decoded[i] = p
		}
		t := New(Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
		t.ReplaceCluster("edge-a", decoded)
		ix := t.Rebuild()
		if a := ix.Lookup("svc-7.ns-20.svc.clusterset.local.", dns.TypeA); len(a.A) == 0 {
			b.Fatal("no answer")
		}
	}
}

// BenchmarkIndexHeap reports the heap per endpoint of the table and its index
// (records plus precomputed answers) for 100,000 endpoints.
func BenchmarkIndexHeap(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		pods := benchPods(100000)
		before := heap()
		b.StartTimer()
		t := New(Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
		t.ReplaceCluster("edge-a", pods)
		ix := t.Rebuild()
		b.StopTimer()
		b.ReportMetric(float64(heap()-before)/float64(len(pods)), "B/endpoint")
		// Every service asked for once: all answers rendered.
		for i := 0; i < len(pods)/10; i++ {
			ix.Lookup(fmt.Sprintf("svc-%d.ns-%d.svc.clusterset.local.", i, (i*10)%50), dns.TypeA)
		}
		b.ReportMetric(float64(heap()-before)/float64(len(pods)), "B/endpoint-rendered")
		runtime.KeepAlive(t)
		runtime.KeepAlive(ix)
		b.StartTimer()
	}
}
