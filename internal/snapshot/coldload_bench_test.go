package snapshot

import (
	"fmt"
	"iter"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// benchPods makes n Pods backing n/per services (per endpoints each) in 50
// namespaces, with one named port, spread over clusters edge-a, edge-b...
func benchPods(n, per, clusters int) []*store.Pod {
	pods := make([]*store.Pod, n)
	for i := range pods {
		ns := fmt.Sprintf("ns-%d", (i/per)%50)
		cl := fmt.Sprintf("edge-%c", 'a'+i%clusters)
		pods[i] = &store.Pod{Common: &store.Common{Cluster: cl, Namespace: ns, Exports: []annotation.Export{{Name: fmt.Sprintf("svc-%d", i/per), Namespace: ns, Cluster: cl,
			Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}}}, Name: fmt.Sprintf("pod-%d", i),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}, Ready: true}
	}
	return pods
}

func encodeAll(b testing.TB, pods []*store.Pod) [][]byte {
	recs := make([][]byte, len(pods))
	for i, p := range pods {
		var err error
		if recs[i], err = EncodePod(p); err != nil {
			b.Fatal(err)
		}
	}
	return recs
}

// loadRecords is a cold start's work after the store has read the records: decode every record
// (sharing common values), load them into a record store, build the index.
func loadRecords(b *testing.B, recs [][]byte) (*store.Store, *table.Index) {
	dec := NewPodDecoder()
	decoded := make([]*store.Pod, len(recs))
	for i, r := range recs {
		p, err := dec.Decode(r)
		if err != nil {
			b.Fatal(err)
		}
		decoded[i] = p
	}
	st := store.New()
	t := table.New(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"}, st)
	clusters := map[string]bool{}
	for _, p := range decoded {
		if !clusters[p.Cluster] {
			clusters[p.Cluster] = true
			st.ReplaceCluster(p.Cluster, decoded) // takes that cluster's records
		}
	}
	return st, t.Rebuild()
}

// BenchmarkColdLoad is a cold start from a snapshot of
// 100,000 endpoints (10,000 services of 10): decode every record, load them,
// build the index, answer.
func BenchmarkColdLoad(b *testing.B) {
	recs := encodeAll(b, benchPods(100000, 10, 1))
	b.ResetTimer()
	for b.Loop() {
		_, ix := loadRecords(b, recs)
		if a := ix.Lookup("svc-7.ns-7.svc.clusterset.local.", dns.TypeA); len(a.A) != 10 {
			b.Fatalf("%d addresses, want 10", len(a.A))
		}
	}
}

// BenchmarkIndexHeap reports the heap per endpoint of 100,000 endpoints
// loaded as from a snapshot: the records (the store), the table and its index
// (B/endpoint), then with every service's name asked, so its answers are
// rendered (B/endpoint-rendered), for services of 10 endpoints and of 1, in
// one cluster, and of 10 endpoints in two clusters.
func BenchmarkIndexHeap(b *testing.B) {
	for _, c := range []struct{ per, clusters int }{{10, 1}, {1, 1}, {10, 2}} {
		name := fmt.Sprintf("endpoints-per-service=%d", c.per)
		if c.clusters > 1 {
			name += fmt.Sprintf(",clusters=%d", c.clusters)
		}
		b.Run(name, func(b *testing.B) {
			const n = 100000
			per, want := c.per, c.per
			if c.clusters > 1 {
				want = per / c.clusters // prefer-local: edge-a's share
			}
			recs := encodeAll(b, benchPods(n, per, c.clusters))
			for b.Loop() {
				b.StopTimer()
				before := heap()
				b.StartTimer()
				t, ix := loadRecords(b, recs)
				b.StopTimer()
				b.ReportMetric(float64(heap()-before)/n, "B/endpoint")
				for i := 0; i < n/per; i++ {
					if a := ix.Lookup(fmt.Sprintf("svc-%d.ns-%d.svc.clusterset.local.", i, i%50), dns.TypeA); len(a.A) != want {
						b.Fatalf("svc-%d: %d addresses, want %d", i, len(a.A), want)
					}
				}
				b.ReportMetric(float64(heap()-before)/n, "B/endpoint-rendered")
				runtime.KeepAlive(t)
				runtime.KeepAlive(ix)
				b.StartTimer()
			}
		})
	}
}

// heap is the live heap after a collection.
func heap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkDecodeOrigins is the decoding part of an edge's cold start from a
// snapshot of relayed origins: 1,000 clusters of 30 records each (10
// services of 3 endpoints), each decoded with DecodeRecords as the plugin
// does, every record kept. B/endpoint is the heap the decoded records hold.
func BenchmarkDecodeOrigins(b *testing.B) {
	const origins, per = 1000, 30
	path := filepath.Join(b.TempDir(), "origins.db")
	st, _, err := Open(path, Options{Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	for o := range origins {
		cl := fmt.Sprintf("o%04d", o)
		pods := benchPods(per, 3, 1)
		recs := map[string][]byte{}
		for _, p := range pods {
			c := *p.Common
			c.Cluster = cl
			c.Exports = []annotation.Export{p.Exports[0]}
			c.Exports[0].Cluster = cl
			p.Common = &c
			v, err := EncodePod(p)
			if err != nil {
				b.Fatal(err)
			}
			recs[p.Namespace+"/"+p.Name] = v
		}
		st.ReplaceSource(cl, recs, Meta{ClusterID: cl})
	}
	if err := st.Flush(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	for b.Loop() {
		b.StopTimer()
		before := heap()
		b.StartTimer()
		var kept [][]*store.Pod
		err := st.Scan(func(cluster string, meta Meta, records iter.Seq2[[]byte, []byte]) error {
			pods, bad, err := DecodeRecords(st, cluster, meta.Records, records)
			if err == nil && (len(pods) != per || len(bad) != 0) {
				err = fmt.Errorf("%s: %d records, %d bad, want %d and none", cluster, len(pods), len(bad), per)
			}
			kept = append(kept, pods)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		b.ReportMetric(float64(heap()-before)/(origins*per), "B/endpoint")
		runtime.KeepAlive(kept)
		b.StartTimer()
	}
}
