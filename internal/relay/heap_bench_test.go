package relay

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// The edge of make bench-relay, without API servers: every origin exports
// the same heapServices services (in two namespaces) of heapPerService
// endpoints, with the same Pod names and addresses (the bench's origins share
// their API servers), unsigned (the hub states each endpoint, Seq 1).
const (
	heapServices   = 10
	heapPerService = 3
)

func heapOrigin(i int) string    { return fmt.Sprintf("o%04d", i) }
func heapNamespace(s int) string { return fmt.Sprintf("bench-%03d", s%2) }
func heapService(s int) string   { return fmt.Sprintf("svc-%05d", s) }
func heapPod(s, j int) string    { return fmt.Sprintf("%s-%d", heapService(s), j) }
func heapIP(s, j int) netip.Addr {
	n := s*heapPerService + j + 1
	return netip.AddrFrom4([4]byte{10, 64, byte(n >> 8), byte(n)})
}
func heapExport(s int) string {
	return `{"services":[{"name":"` + heapService(s) + `","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`
}

// heapSlice is the EndpointSlice hub k writes for service s of origin i,
// its strings allocated apart as a decoded object's are.
func heapSlice(k, i, s int) *discoveryv1.EndpointSlice {
	origin := heapOrigin(i)
	pods := make([]Pod, heapPerService)
	for j := range pods {
		ep := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{heapIP(s, j).String()}, Ready: true, Seq: 1})
		pods[j] = Pod{Name: heapPod(s, j), UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, s*heapPerService+j), Endpoint: ep}
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: strings.Clone(heapNamespace(s)), Name: fmt.Sprintf("%s-%s-%05x", heapService(s), origin, i), // as clusterset names it: alike on every hub
			ResourceVersion: fmt.Sprint(1000 + i*heapServices + s), UID: types.UID(fmt.Sprintf("%08x-%04x-4000-8000-%012x", i, k, s)),
			Labels: map[string]string{
				discoveryv1.LabelManagedBy:    clusterset.ManagedBy,
				mcsv1beta1.LabelSourceCluster: strings.Clone(origin),
				mcsv1beta1.LabelServiceName:   heapService(s),
			},
			Annotations: map[string]string{SliceAnnotation: Format(Slice{Exports: []string{heapExport(s)}, Pods: pods})},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
}

// heapDirect writes origin i's records as a direct peer's source does: one
// Common per service.
func heapDirect(st *store.Store, i int) {
	origin := heapOrigin(i)
	pods := make([]*store.Pod, 0, heapServices*heapPerService)
	for s := range heapServices {
		ns := heapNamespace(s)
		exports, _ := annotation.ParseExports(heapExport(s), ns, origin)
		c := &store.Common{Cluster: origin, Namespace: ns, Exports: exports}
		for j := range heapPerService {
			pods = append(pods, &store.Pod{Common: c, Name: heapPod(s, j), IPs: []netip.Addr{heapIP(s, j)}, Ready: true})
		}
	}
	st.ReplaceCluster(origin, pods)
}

// heapRelayed feeds every origin's slices and Leases through two hubs into
// r, as their first lists, each hub then in contact.
func heapRelayed(r *Relay, origins int) {
	now := time.Now()
	for k, h := range r.hubs {
		p := &slicePart{}
		p.st = h.sliceStore(p)
		h.parts = []*slicePart{p}
		h.leaseSt = h.leaseStore()
		leases := make([]any, 0, origins)
		for i := range origins {
			leases = append(leases, r.toLease(lease(DefaultNamespace, heapOrigin(i), source.Connected, now)))
		}
		_ = h.leaseSt.Replace(leases, "")
		slices := make([]any, 0, origins*heapServices)
		for i := range origins {
			for s := range heapServices {
				slices = append(slices, r.toSlim(heapSlice(k, i, s)))
			}
		}
		_ = p.st.Replace(slices, "")
		h.touch()
	}
}

// heapProfile names the file BenchmarkRelayHeap writes the heap profile of
// the relayed edge to (finely sampled), for go tool pprof -sample_index
// inuse_space.
var heapProfile = flag.String("relayheap.profile", "", "write the relayed edge's heap profile to this file")

// BenchmarkRelayHeap is the heap an edge holds per relayed endpoint (the
// hubs' slice stores, the relay's state, the record store, the table and its
// index; B/endpoint-relayed), beside the same records read from direct
// peers (B/endpoint-direct), before and after every service's answers are
// rendered, and the ratio relayed/direct.
//
//	go test -run '^$' -bench RelayHeap -benchtime 3x ./internal/relay/
func BenchmarkRelayHeap(b *testing.B) {
	if *heapProfile != "" {
		runtime.MemProfileRate = 512
	}
	for _, origins := range []int{1000} {
		b.Run(fmt.Sprintf("origins=%d", origins), func(b *testing.B) {
			n := float64(origins * heapServices * heapPerService)
			cfg := table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge"}
			render := func(t *table.Table) {
				ix := t.Rebuild()
				for s := range heapServices {
					name := heapService(s) + "." + heapNamespace(s) + ".svc.clusterset.local."
					if a := ix.Lookup(name, dns.TypeA); len(a.A) == 0 {
						b.Fatalf("%s: no addresses", name)
					}
					ep := strings.ReplaceAll(heapIP(s, 0).String(), ".", "-") + "." + heapOrigin(origins-1) + "." + name
					if a := ix.Lookup(ep, dns.TypeA); len(a.A) != 1 {
						b.Fatalf("%s: %d addresses, want 1", ep, len(a.A))
					}
				}
			}
			var direct, directR, relayed, relayedR float64
			for b.Loop() {
				// The hubs' clients, made first: the first fake clientset
				// builds the process's type converter once.
				clients := []*fake.Clientset{fake.NewClientset(), fake.NewClientset()}
				// Direct: the records as direct peers' sources write them.
				before := heapNow()
				st := store.New()
				t := table.New(cfg, st)
				for i := range origins {
					heapDirect(st, i)
				}
				t.Rebuild()
				direct = float64(heapNow()-before) / n
				render(t)
				directR = float64(heapNow()-before) / n
				runtime.KeepAlive(t)
				st, t = nil, nil

				// Relayed: the same records through two hubs.
				before = heapNow()
				st = store.New()
				t = table.New(cfg, st)
				r := New(st, Config{Local: "edge"})
				for k, c := range clients {
					if err := r.AddHub(fmt.Sprintf("hub-%d", k+1), c, ""); err != nil {
						b.Fatal(err)
					}
				}
				heapRelayed(r, origins)
				if got := len(st.Pods("")); got != int(n) {
					b.Fatalf("%d records, want %.0f", got, n)
				}
				t.Rebuild()
				relayed = float64(heapNow()-before) / n
				render(t)
				relayedR = float64(heapNow()-before) / n
				if *heapProfile != "" {
					writeHeapProfile(b, *heapProfile)
				}
				runtime.KeepAlive(r)
				runtime.KeepAlive(t)
			}
			b.ReportMetric(direct, "B/endpoint-direct")
			b.ReportMetric(relayed, "B/endpoint-relayed")
			b.ReportMetric(relayed/direct, "ratio")
			b.ReportMetric(directR, "B/endpoint-direct-rendered")
			b.ReportMetric(relayedR, "B/endpoint-relayed-rendered")
			b.ReportMetric(relayedR/directR, "ratio-rendered")
		})
	}
}

// heapNow is the live heap after two collections.
func heapNow() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
