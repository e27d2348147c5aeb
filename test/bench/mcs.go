package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The MCS controller's stage (issue 23): three real clusters, every
// service exported by two of them, the controller (bin/mcs-annotator
// --mcs-controller) in the first with the other two as peers.

var mcsClusters = []string{"mcs-a", "mcs-b", "mcs-c"}

// mcsResult is what the MCS stage measured.
type mcsResult struct {
	Services, Pods int
	LoadTook       time.Duration // creating the exporter Pods in the three clusters
	FirstSync      time.Duration // the controller's start to every ServiceImport written and its writes quiet
	FirstWrites    map[string]float64
	// Lat: an exporter Pod's readiness flipped in the peer mcs-b, to the
	// EndpointSlice in mcs-a showing it (watched).
	Lat []time.Duration
	// Writes are the controller's writes by kind over all the changes (its
	// mcs_controller_writes_total, after the writes went quiet).
	Writes map[string]float64
	// SliceEvents are the EndpointSlice watch events in mcs-a over the changes.
	SliceEvents int
	// GoBench is BenchmarkControllerMemory's line (fake clientsets), its
	// heap per endpoint and its time per change.
	GoBench         []string
	HeapPerEndpoint float64
	Reconcile       time.Duration
}

// mcsExporters are the clusters (indexes into mcsClusters) that export service i.
func mcsExporters(i int) []int { return []int{i % 3, (i + 1) % 3} }

func mcsStage(ctx context.Context, b *harness.Program, res *results, _ *world) {
	cfg := res.Cfg
	r := &mcsResult{Services: cfg.Services, Writes: map[string]float64{}}
	res.MCS = r
	cs := harness.StartClusters(b, mcsClusters...)
	d := dataset{services: cfg.Services, endpoints: len(mcsClusters), namespaces: cfg.Namespaces}
	for _, c := range cs {
		c.InstallMCSCRDs(b)
		for n := 0; n < d.namespaces && n < d.services; n++ {
			c.CreateNamespace(b, d.namespace(n))
		}
	}

	// Exporter Pods: endpoint j of service i is in cluster j, with the
	// address ip(i, j).
	var pods []exporterPod
	for i := 0; i < d.services; i++ {
		for _, c := range mcsExporters(i) {
			pods = append(pods, d.exporterPod(cs[c], i, c))
		}
	}
	start := time.Now()
	createPods(b, "exporter Pods (3 clusters)", cfg.Workers, pods)
	r.Pods, r.LoadTook = len(pods), time.Since(start)
	b.Logf("created %d exporter Pods in 3 clusters in %s", r.Pods, r.LoadTook.Round(time.Millisecond))

	start = time.Now()
	ctl := harness.StartAnnotator(b, cs[0].Kubeconfig, "--cluster", mcsClusters[0], "--leader-elect=false", "-mcs-controller",
		"-peer", mcsClusters[1]+"="+cs[1].Kubeconfig, "-peer", mcsClusters[2]+"="+cs[2].Kubeconfig)
	defer func() {
		_ = os.WriteFile(filepath.Join(cfg.Raw, "mcs-controller.log"), []byte(ctl.Log()), 0o644)
	}()
	waitQuiet(b, ctl, func() bool {
		v, _, _ := ctl.Metric("mcs_controller_serviceimports")
		return int(v) == d.services
	}, 30*time.Minute)
	r.FirstSync, r.FirstWrites = time.Since(start), controllerWrites(b, ctl)
	b.Logf("the controller wrote %d ServiceImports in %s: %v", d.services, r.FirstSync.Round(time.Millisecond), r.FirstWrites)

	// Changes: the readiness of service i's Pod in mcs-b flips; the time runs
	// to the watch event of mcs-a's slice showing it.
	peer := cs[1]
	sel := labels.Set{discoveryv1.LabelManagedBy: clusterset.ManagedBy, mcsv1beta1.LabelSourceCluster: mcsClusters[1]}.String()
	cx, cancel := context.WithCancel(ctx)
	defer cancel()
	list, err := cs[0].Client.DiscoveryV1().EndpointSlices("").List(cx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		b.Fatalf("listing EndpointSlices: %v", err)
	}
	w, err := cs[0].WatchClient.DiscoveryV1().EndpointSlices("").Watch(cx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		b.Fatalf("watching EndpointSlices: %v", err)
	}
	defer w.Stop()
	before := controllerWrites(b, ctl)
	var candidates []int
	for i := 0; i < d.services && len(candidates) < cfg.Changes; i++ {
		if mcsExporters(i)[0] == 1 || mcsExporters(i)[1] == 1 {
			candidates = append(candidates, i)
		}
	}
	for _, i := range candidates {
		ip := d.ip(i, 1).String()
		start := time.Now()
		peer.SetPodReady(b, d.namespace(i), d.pod(i, 1), false, ip)
		if n, ok := waitSlice(w, d.namespace(i), ip, 30*time.Second); !ok {
			b.Fatalf("service %s: mcs-a's slice did not show %s not ready within 30 s", d.service(i), ip)
		} else {
			r.SliceEvents += n
		}
		r.Lat = append(r.Lat, time.Since(start))
	}
	waitQuiet(b, ctl, func() bool { return true }, 5*time.Minute)
	after := controllerWrites(b, ctl)
	for k, v := range after {
		if dv := v - before[k]; dv > 0 {
			r.Writes[k] = dv
		}
	}
	b.Logf("MCS propagation through a peer: %d changes, p50 %s, p99 %s; writes %v; %d slice events", len(r.Lat),
		pct(r.Lat, 50), pct(r.Lat, 99), r.Writes, r.SliceEvents)

	mcsGoBench(ctx, b, res, r)
}

// waitSlice reads slice events until one in namespace ns has the endpoint
// ip not ready, and returns how many events it read.
func waitSlice(w watch.Interface, ns, ip string, bound time.Duration) (int, bool) {
	timeout := time.After(bound)
	n := 0
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return n, false // the watch ended: a failure of the bench, not a slow change
			}
			n++
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || s.Namespace != ns {
				continue
			}
			for _, e := range s.Endpoints {
				if len(e.Addresses) > 0 && e.Addresses[0] == ip && e.Conditions.Ready != nil && !*e.Conditions.Ready {
					return n, true
				}
			}
		case <-timeout:
			return n, false
		}
	}
}

// controllerWrites reads mcs_controller_writes_total{result="ok"} by kind.
func controllerWrites(t harness.T, a *harness.Annotator) map[string]float64 {
	mfs, err := a.Metrics()
	if err != nil {
		t.Fatalf("controller metrics: %v", err)
	}
	out := map[string]float64{}
	for _, m := range mfs["mcs_controller_writes_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if v := m.GetCounter().GetValue(); labels["result"] == "ok" && v > 0 {
			out[labels["kind"]] += v
		}
	}
	return out
}

// waitQuiet waits until ready holds and the controller's writes have not
// moved for 5 s.
func waitQuiet(t harness.T, a *harness.Annotator, ready func() bool, bound time.Duration) {
	last, since := "", time.Now()
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, bound, true, func(context.Context) (bool, error) {
		if w := fmt.Sprint(controllerWrites(t, a)); w != last {
			last, since = w, time.Now()
		}
		return ready() && time.Since(since) >= 5*time.Second, nil
	})
	if err != nil {
		t.Fatalf("the MCS controller did not settle within %s (writes %s)\n%s", bound, last, harness.Tail(a.Process().LogPath, 20))
	}
}

// mcsGoBench runs BenchmarkControllerMemory (fake clientsets) at 100,000
// endpoints over the stage's services (10 by default at -smoke).
func mcsGoBench(ctx context.Context, b *harness.Program, res *results, r *mcsResult) {
	endpoints := 100000
	if res.Cfg.Smoke {
		endpoints = 10 * res.Cfg.Services
	}
	out := goTest(ctx, b, res, "gobench-mcscontroller.txt", 30*time.Minute, "-run", "^$", "-bench", "^BenchmarkControllerMemory$", "-benchtime", "3x",
		"./internal/mcscontroller/", "-args", "-mcs.endpoints", strconv.Itoa(endpoints), "-mcs.services", strconv.Itoa(res.Cfg.Services))
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "heap-B/endpoint") { // klog's lines may split the name from the figures
			l = "BenchmarkControllerMemory " + strings.Join(strings.Fields(l), " ")
			r.GoBench = append(r.GoBench, l)
			r.HeapPerEndpoint = benchFigure(l, "heap-B/endpoint")
			r.Reconcile = time.Duration(benchFigure(l, "ns/op"))
		}
	}
}

// benchFigure is the figure of unit in a Go benchmark's result line, 0 if none.
func benchFigure(line, unit string) float64 {
	f := strings.Fields(line)
	for i := 1; i < len(f); i++ {
		if f[i] == unit {
			v, _ := strconv.ParseFloat(f[i-1], 64)
			return v
		}
	}
	return 0
}

func mcsTargets(r *results) []target {
	m := r.MCS
	if m == nil {
		return nil
	}
	var ts []target
	ts = append(ts, target{"MCS: exporter Pod change in a peer to the EndpointSlice in the controller's cluster, p99 <= 2 s",
		fmt.Sprintf("p99 %s (p50 %s) over %d changes, %d services", ms(pct(m.Lat, 99)), ms(pct(m.Lat, 50)), len(m.Lat), m.Services),
		pct(m.Lat, 99) <= 2*time.Second, len(m.Lat) > 0 && m.Services >= 10000})
	n := float64(len(m.Lat))
	slices := m.Writes["endpointslice"]
	other := 0.0
	for k, v := range m.Writes {
		if k != "endpointslice" {
			other += v
		}
	}
	ts = append(ts, target{"MCS: one slice write per changed slice (one changed slice per change)",
		fmt.Sprintf("%.2f slice writes per change (%.0f other writes in all; %d slice watch events)", slices/n, other, m.SliceEvents),
		n > 0 && slices/n <= 1 && other == 0, n > 0})
	return ts
}
