package mcsannotations

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// coldEndpoints is the size of the snapshot BenchmarkSnapshotColdStart loads:
// 10,000 services of 10 endpoints in 50 namespaces, of one cluster.
const coldEndpoints, coldPerService = 100_000, 10

// writeColdSnapshot writes the snapshot file of BenchmarkSnapshotColdStart.
func writeColdSnapshot(b *testing.B, path string) {
	st, _, err := snapshot.Open(path, snapshot.Options{Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	recs := make(map[string][]byte, coldEndpoints)
	for i := range coldEndpoints {
		ns := fmt.Sprintf("ns-%d", (i/coldPerService)%50)
		p := &store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: ns, Exports: []annotation.Export{{
			Name: fmt.Sprintf("svc-%d", i/coldPerService), Namespace: ns, Cluster: "edge-a",
			Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}}},
			Name: fmt.Sprintf("pod-%d", i), Ready: true, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}}
		v, err := snapshot.EncodePod(p)
		if err != nil {
			b.Fatal(err)
		}
		recs[ns+"/"+p.Name] = v
	}
	now := time.Now()
	st.ReplaceSource("edge-a", recs, snapshot.Meta{ClusterID: "edge-a", LastContact: now, LastFullSync: now})
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
}

// coldMCS is a plugin instance as newMCS makes it for one cluster, with a
// source that is never started.
func coldMCS(path string) *MCS {
	records := store.New()
	t := table.New(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"}, records)
	m := &MCS{zones: []string{"clusterset.local."}, records: records, table: t, snapshotPath: path, clients: clients.NewIndex()}
	m.sources = []*source.Source{source.New("edge-a", fake.NewClientset(), records, source.Events{}, source.Options{})}
	return m
}

// BenchmarkSnapshotColdStart is a CoreDNS start from a snapshot of 100,000
// endpoints: open the file, decode and load every record, build the index
// (loadSnapshot), answer; and the heap that stays per endpoint (the records,
// the table and its index, unrendered: B/endpoint).
func BenchmarkSnapshotColdStart(b *testing.B) {
	path := filepath.Join(b.TempDir(), "mcs.db")
	writeColdSnapshot(b, path)
	for b.Loop() {
		b.StopTimer()
		before := coldHeap()
		b.StartTimer()
		m := coldMCS(path)
		st, err := m.openStore()
		if err != nil {
			b.Fatal(err)
		}
		m.loadSnapshot(st)
		if a := m.table.Index().Lookup("svc-7.ns-7.svc.clusterset.local.", dns.TypeA); len(a.A) != coldPerService {
			b.Fatalf("%d addresses, want %d", len(a.A), coldPerService)
		}
		b.StopTimer()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(coldHeap()-before)/coldEndpoints, "B/endpoint")
		runtime.KeepAlive(m)
		b.StartTimer()
	}
}

// coldHeap is the live heap after two collections (the second frees what
// sync.Pools, bbolt's among them, kept through the first).
func coldHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
