package mcscontroller

import (
	"flag"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	runtimeobj "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

var (
	benchEndpoints = flag.Int("mcs.endpoints", 100000, "endpoints of BenchmarkControllerMemory")
	benchServices  = flag.Int("mcs.services", 10000, "exported services of BenchmarkControllerMemory")
	benchClusters  = flag.Int("mcs.clusters", 3, "clusters the endpoints of BenchmarkControllerMemory are spread over (a relay hub's origins: -mcs.clusters 1000 -mcs.services 10 -mcs.endpoints 30000 is make bench-relay's shape)")
)

// benchCluster names cluster j of the benchmark: a, b, c (a is the local
// cluster) when there are at most 26, oNNNN beyond.
func benchCluster(j int) string {
	if *benchClusters <= 26 {
		return string(rune('a' + j))
	}
	return fmt.Sprintf("o%04d", j)
}

// benchPods are the exporter Pods of the benchmark: endpoints Pods over
// services services (in namespace ns), endpoint j of a service in cluster
// benchCluster(j mod -mcs.clusters), every service ClusterSetIP. With proofs, each
// carries a proof as a relay hub's sources keep it (a Common of its own, a
// signed statement, the export annotation shared by its service).
func benchPods(services, endpoints int, proofs ...bool) []*store.Pod {
	commons := map[string]*store.Common{}
	var out []*store.Pod
	for n := 0; n < endpoints; n++ {
		i, j := n%services, n/services
		cl := benchCluster(j % *benchClusters)
		name := fmt.Sprintf("svc-%05d", i)
		c := commons[cl+"/"+name]
		if c == nil {
			c = &store.Common{Cluster: cl, Namespace: "ns", Exports: []annotation.Export{{Name: name, Namespace: "ns", Cluster: cl,
				Ports:   []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}},
				Service: annotation.Service{Type: annotation.TypeClusterSetIP}}}}
			commons[cl+"/"+name] = c
		}
		p := &store.Pod{Common: c, Name: fmt.Sprintf("%s-%d", name, j),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})}, Ready: true}
		if len(proofs) > 0 && proofs[0] {
			own := *c
			own.Proof = &store.Proof{UID: fmt.Sprintf("%08d-0000-4000-8000-000000000000", n), Export: benchExports[cl+"/"+name],
				Endpoint:          annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{p.IPs[0].String()}, Ready: true, Seq: 1764290000000 + uint64(n)}),
				EndpointSignature: annotation.SignaturePrefix + strings.Repeat("A", 86) + "=="}
			if own.Proof.Export == "" {
				own.Proof.Export = fmt.Sprintf(`{"services":[{"name":%q,"namespace":"ns","cluster":%q,"ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}],"type":"ClusterSetIP","exportedAt":"2026-11-28T00:00:00Z"}]}`, name, cl)
				benchExports[cl+"/"+name] = own.Proof.Export
			}
			p.Common = &own
		}
		out = append(out, p)
	}
	return out
}

// benchExports are the export annotations of benchPods' proofs, one string
// per service and cluster, as the parse cache shares them.
var benchExports = map[string]string{}

func heapInUse() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkControllerMemory is the controller's heap per endpoint in a
// steady state (-mcs.endpoints, default 100,000, over -mcs.services): the
// store of records, the informer caches of the objects it wrote and its own
// state, after a reconcile that finds everything written. The objects are
// first written through fake clientsets by a controller, then handed to the
// fakes of a new one, so that the API server's copies (the fakes' trackers)
// are not counted. Each iteration is one Pod's readiness flipped and the
// reconcile that writes it: what one change costs the controller.
func BenchmarkControllerMemory(b *testing.B) { controllerMemory(b, false) }

// BenchmarkHubMemory is BenchmarkControllerMemory for a relay hub: records
// with proofs, slices of RelayEndpointsPerSlice with the relay annotation.
func BenchmarkHubMemory(b *testing.B) { controllerMemory(b, true) }

func controllerMemory(b *testing.B, hub bool) {
	services, endpoints := *benchServices, *benchEndpoints
	cfg := Config{MaxImportsPerNamespace: -1, MaxImportsPerCluster: -1, Relay: hub, RelayNamespace: hubNS}
	clusters := make([]string, *benchClusters)
	for j := range clusters {
		clusters[j] = benchCluster(j)
	}
	srcs := func() []*fakeSource {
		now := time.Now()
		out := make([]*fakeSource, 0, len(clusters))
		for _, cl := range clusters {
			out = append(out, newSource(cl, true, now))
		}
		return out
	}
	// The objects, as a controller writes them.
	first := newEnv(b, cfg, srcs())
	// Its informers list, but watch nothing: the fakes' watchers hold 100
	// events and panic beyond, which tens of thousands of writes in one
	// reconcile overrun. It writes without looking at what it wrote.
	quiet := func(clienttesting.Action) (bool, watch.Interface, error) { return true, watch.NewFake(), nil }
	first.client.PrependWatchReactor("*", quiet)
	first.dyn.PrependWatchReactor("*", quiet)
	pods := benchPods(services, endpoints, hub)
	for _, cl := range clusters {
		first.table.ReplaceCluster(cl, pods)
	}
	first.start(false)
	first.waitSynced()
	if err := first.ctl.Reconcile(first.ctx); err != nil {
		b.Fatal(err)
	}
	var objs []runtimeobj.Object
	for _, s := range first.slices() {
		if _, ok := s.Annotations[relay.SliceAnnotation]; ok != hub || hub && len(s.Endpoints) > clusterset.RelayEndpointsPerSlice {
			b.Fatalf("slice %s of %d endpoints: relay annotation %v, want %v", s.Name, len(s.Endpoints), ok, hub)
		}
		objs = append(objs, s.DeepCopy())
	}
	for _, s := range first.derivedServices() {
		objs = append(objs, s.DeepCopy())
	}
	l, err := first.dyn.Tracker().List(importsGVR, importsGVR.GroupVersion().WithKind("ServiceImport"), "ns")
	if err != nil {
		b.Fatal(err)
	}
	for _, o := range l.(*unstructured.UnstructuredList).Items {
		objs = append(objs, o.DeepCopy())
	}
	first.cancel()
	first, pods = nil, nil

	e := newEnv(b, cfg, srcs(), objs...)
	objs = nil
	before := heapInUse()
	pods = benchPods(services, endpoints, hub)
	for _, cl := range clusters {
		e.table.ReplaceCluster(cl, pods)
	}
	pods = nil
	e.start(false)
	e.waitSynced()
	if err := e.ctl.Reconcile(e.ctx); err != nil {
		b.Fatal(err)
	}
	if w := e.writes(); len(w) > 0 {
		b.Fatalf("%d writes in a reconcile of what is written, first %s", len(w), w[0])
	}
	after := heapInUse()
	b.ResetTimer()
	all := e.table.Pods("")
	for n := range b.N {
		p := *all[n%len(all)]
		p.Ready = !p.Ready
		e.table.Upsert(&p)
		if err := e.ctl.Reconcile(e.ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(after-before)/float64(endpoints), "heap-B/endpoint")
	b.ReportMetric(float64(endpoints), "endpoints")
}
