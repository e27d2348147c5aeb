package mcsannotations

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"
	"github.com/miekg/dns"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// The edge of make bench-relay in one process, its hubs fake clientsets:
// every origin exports the same edgeServices services (in two namespaces) of
// edgePerService endpoints, unsigned.
const (
	edgeServices   = 10
	edgePerService = 3
)

const edgeCorefile = `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge
        kubeconfig /local
        hub hub-1 /hub-1
        hub hub-2 /hub-2
        {HUBNS}
        snapshot {SNAPSHOT}
    }
}`

func edgeNamespace(s int) string { return fmt.Sprintf("bench-%03d", s%2) }
func edgeService(s int) string   { return fmt.Sprintf("svc-%05d", s) }
func edgeIP(s, j int) netip.Addr {
	n := s*edgePerService + j + 1
	return netip.AddrFrom4([4]byte{10, 64, byte(n >> 8), byte(n)})
}

// edgeLimit is the hub_namespaces of the limited edge: one namespace of
// the two, so that it takes half the fleet's services.
const edgeLimit = "bench-000"

// edgeHub is a hub's API server holding every origin's slices and Leases.
func edgeHub(hub string, origins []string) kubernetes.Interface {
	var objs []k8sruntime.Object
	now := time.Now()
	for _, o := range origins {
		objs = append(objs, originLease(hub, o, source.Connected, now))
		for s := range edgeServices {
			export := `{"services":[{"name":"` + edgeService(s) + `","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`
			var pods []relay.Pod
			for j := range edgePerService {
				name := fmt.Sprintf("%s-%d", edgeService(s), j)
				ep := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{edgeIP(s, j).String()}, Ready: true, Seq: 1})
				pods = append(pods, relay.Pod{Name: name, UID: fmt.Sprintf("%s-%s", o, name), Endpoint: ep})
			}
			objs = append(objs, relaySliceObject(edgeNamespace(s), fmt.Sprintf("%s-%s", edgeService(s), o), o, export, pods...))
		}
	}
	return fake.NewClientset(objs...)
}

// edgeProfile names the file BenchmarkRelayEdgeHeap writes the heap profile
// of the loaded edge to (finely sampled), for go tool pprof -sample_index
// inuse_space.
var edgeProfile = flag.String("relayedge.profile", "", "write the relaying edge's heap profile to this file")

// BenchmarkRelayEdgeHeap is a CoreDNS reading two hubs (fake clientsets)
// that relay origins × edgeServices × edgePerService endpoints: its heap
// (the plugin with its relay, store, table, snapshot, series and per-origin
// state) once every record is in and every origin refreshed
// (B/endpoint), then with every service's answers rendered
// (B/endpoint-rendered), beyond the same CoreDNS with hubs that relay
// nothing, per endpoint; and the heap of the same edge limited to one
// namespace of the two (hub_namespaces), per endpoint of the fleet
// (B/endpoint-limited), and as a ratio to the edge that takes everything
// (limited/all): what the limit saves an edge. The slices are the fakes' own objects, copied
// without their strings: what a slice's transform keeps of its name,
// namespace, version, UID and source-cluster label is not counted here
// (internal/relay's BenchmarkRelayHeap counts it).
//
//	go test -run '^$' -bench RelayEdgeHeap -benchtime 1x ./plugin/mcsannotations/
func BenchmarkRelayEdgeHeap(b *testing.B) {
	const origins = 1000
	if *edgeProfile != "" {
		runtime.MemProfileRate = 512
	}
	run := 0
	// edge starts the CoreDNS over hubs relaying n origins and returns its
	// heap beyond the heap before its start, before and after rendering.
	edge := func(n int, limited bool) (loaded, rendered int64) {
		run++
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("r%d-o%04d", run, i) // new series each run
		}
		clients := map[string]kubernetes.Interface{"/local": fake.NewClientset(), "/hub-1": edgeHub("hub-1", names), "/hub-2": edgeHub("hub-2", names)}
		old := clientFor
		clientFor = func(kubeconfig, _ string) (kubernetes.Interface, error) { return clients[kubeconfig], nil }
		defer func() { clientFor = old }()
		corefile := strings.ReplaceAll(edgeCorefile, "{SNAPSHOT}", filepath.Join(b.TempDir(), "edge.db"))
		hubns := ""
		if limited {
			hubns = "hub_namespaces " + edgeLimit
		}
		corefile = strings.ReplaceAll(corefile, "{HUBNS}", hubns)
		taken := func(s int) bool { return !limited || edgeNamespace(s) == edgeLimit }

		before := edgeHeap()
		i, _, _, err := coretest.CoreDNSServerAndPorts(corefile)
		if err != nil {
			b.Fatal(err)
		}
		defer stopServer(i)
		collector.mu.Lock()
		var m *MCS
		for x := range collector.live {
			m = x
		}
		collector.mu.Unlock()
		want := 0
		for s := range edgeServices {
			if taken(s) {
				want += n * edgePerService
			}
		}
		for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			held := 0
			for _, c := range m.records.Len() {
				held += c
			}
			refreshed := 0
			m.origins.each(func(*clusterContact) { refreshed++ })
			if held == want && refreshed == n && m.hubsSynced() {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d records of %d, %d origins of %d", held, want, refreshed, n)
			}
		}
		time.Sleep(2 * staleEvery) // the snapshot's writes and the refreshes settle
		ix := m.table.Rebuild()
		loaded = edgeHeap() - before
		if n > 0 {
			for s := range edgeServices {
				name := edgeService(s) + "." + edgeNamespace(s) + ".svc.clusterset.local."
				if a := ix.Lookup(name, dns.TypeA); (len(a.A) > 0) != taken(s) {
					b.Fatalf("%s: %d addresses, limited to %s: %v", name, len(a.A), edgeLimit, limited)
				}
			}
		}
		rendered = edgeHeap() - before
		if n > 0 && !limited && *edgeProfile != "" {
			f, err := os.Create(*edgeProfile)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				b.Fatal(err)
			}
		}
		runtime.KeepAlive(clients)
		return loaded, rendered
	}
	var per, perR, perL float64
	for b.Loop() {
		l0, r0 := edge(0, false)
		l, r := edge(origins, false)
		// The last edge's memory is let go only during the next start
		// (something of the server's start, not found, holds the stopped
		// one): an empty start first, not measured, so that the empty
		// limited edge's reading does not count the release.
		edge(0, true)
		l0L, _ := edge(0, true)
		lL, _ := edge(origins, true)
		eps := float64(origins * edgeServices * edgePerService)
		per, perR, perL = float64(l-l0)/eps, float64(r-r0)/eps, float64(lL-l0L)/eps
	}
	b.ReportMetric(per, "B/endpoint")
	b.ReportMetric(perR, "B/endpoint-rendered")
	b.ReportMetric(perL, "B/endpoint-limited")
	b.ReportMetric(perL/per, "limited/all")
}

// edgeHeap is the live heap after two collections.
func edgeHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
