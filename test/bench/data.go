package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	mcs "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const (
	zone       = "clusterset.local."
	portName   = "http"
	svcPort    = 80
	targetPort = 8080
)

// dataset is the deterministic benchmark data: services svc-NNNNN spread over
// namespaces bench-NNN (service i in namespace i mod namespaces), each backed
// by endpoints Pods svc-NNNNN-J with the fixed IPv4 address ip(i, j).
type dataset struct {
	cluster    string
	services   int
	endpoints  int
	namespaces int
	loopback   bool // addresses in 127.201.0.0/16, not 10.64.0.0/10
}

func (d dataset) namespace(i int) string { return fmt.Sprintf("bench-%03d", i%d.namespaces) }
func (d dataset) service(i int) string   { return fmt.Sprintf("svc-%05d", i) }
func (d dataset) pod(i, j int) string    { return fmt.Sprintf("%s-%d", d.service(i), j) }
func (d dataset) total() int             { return d.services * d.endpoints }

// qname is the clusterset name of service i.
func (d dataset) qname(i int) string {
	return d.service(i) + "." + d.namespace(i) + ".svc." + zone
}

// ip is endpoint j of service i: 10.64.0.1 onwards, unique for up to 4
// million endpoints (127.201.0.1 onwards, up to 3.6 million, with loopback).
func (d dataset) ip(i, j int) netip.Addr {
	n := i*d.endpoints + j + 1
	if d.loopback {
		return netip.AddrFrom4([4]byte{127, byte(201 + n>>16), byte(n >> 8), byte(n)})
	}
	return netip.AddrFrom4([4]byte{10, byte(64 + n>>16), byte(n >> 8), byte(n)})
}

// ips are the endpoint addresses of service i, sorted as strings.
func (d dataset) ips(i int) []string {
	out := make([]string, d.endpoints)
	for j := range out {
		out[j] = d.ip(i, j).String()
	}
	sort.Strings(out)
	return out
}

// exportService is the export annotation entry of service i.
func (d dataset) exportService(i int) harness.ExportService {
	return harness.ExportService{Name: d.service(i), Ports: []harness.ExportPort{{Name: portName, Port: svcPort, TargetPort: targetPort, Protocol: "TCP"}}}
}

// tablePod is endpoint j of service i as the plugin's record store keeps it
// (for snapshot files written directly).
func (d dataset) tablePod(i, j int) *store.Pod {
	p := &store.Pod{
		Common: &store.Common{Cluster: d.cluster, Namespace: d.namespace(i)}, Name: d.pod(i, j),
		IPs: []netip.Addr{d.ip(i, j)}, Ready: true,
	}
	e := annotation.Export{Name: d.service(i), Namespace: p.Namespace, Cluster: d.cluster}
	for _, pt := range d.exportService(i).Ports {
		e.Ports = append(e.Ports, annotation.Port{Name: pt.Name, Port: pt.Port, TargetPort: pt.TargetPort, Protocol: pt.Protocol})
	}
	p.Exports = []annotation.Export{e}
	return p
}

// parallel runs f(0..n-1) on workers goroutines, stops handing out work
// after the first failure and returns the first error. It logs every 10 s
// how far it is.
func parallel(t harness.T, what string, n, workers int, f func(i int) error) error {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var done atomic.Int64
	stop := make(chan struct{})
	go wait.Until(func() { t.Logf("%s: %d of %d", what, done.Load(), n) }, 10*time.Second, stop)
	defer close(stop)
	workqueue.ParallelizeUntil(ctx, workers, n, func(i int) {
		if err := f(i); err != nil {
			cancel(err)
		}
		done.Add(1)
	})
	return context.Cause(ctx)
}

// createPods creates each exporter Pod, Running and Ready with its IPs (the
// harness acts as the kubelet), on workers goroutines.
func createPods(t *harness.Program, what string, workers int, pods []exporterPod) {
	err := parallel(t, what, len(pods), workers, func(k int) error {
		p := pods[k]
		if !t.Run(func() { p.c.CreateReadyPods(t, p.ns, p.pod) }) {
			return fmt.Errorf("pod %s/%s in %s", p.ns, p.pod.Pod.Name, p.c.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("creating %s: %v", what, err)
	}
}

// exporterPod is one Pod for createPods.
type exporterPod struct {
	c   *harness.Cluster
	ns  string
	pod harness.ReadyPod
}

// pod is endpoint j of service i as an exporter Pod in c.
func (d dataset) exporterPod(c *harness.Cluster, i, j int) exporterPod {
	return exporterPod{c, d.namespace(i), harness.ReadyPod{Pod: harness.ExporterPod(d.pod(i, j), "", d.exportService(i)), IPs: []string{d.ip(i, j).String()}}}
}

// load creates the namespaces, the exporter Pods and, when mcsToo, the MCS
// CRDs, one Headless ServiceImport and one EndpointSlice per service for the
// in-tree kubernetes multicluster reference.
func (d dataset) load(t *harness.Program, c *harness.Cluster, workers int, mcsToo bool) *dataResult {
	st := &dataResult{}
	for n := 0; n < d.namespaces && n < d.services; n++ {
		c.CreateNamespace(t, d.namespace(n))
	}
	start := time.Now()
	pods := make([]exporterPod, 0, d.total())
	for k := 0; k < d.total(); k++ {
		pods = append(pods, d.exporterPod(c, k/d.endpoints, k%d.endpoints))
	}
	createPods(t, "exporter Pods", workers, pods)
	st.Pods, st.PodsTook = d.total(), time.Since(start)
	t.Logf("created %d exporter Pods (Running, Ready, with IPs) in %s: %.0f Pods/s with %d workers",
		st.Pods, st.PodsTook.Round(time.Millisecond), st.PodRate(), workers)
	if !mcsToo {
		return st
	}

	c.InstallMCSCRDs(t)
	mc, err := mcsclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatalf("mcs client: %v", err)
	}
	start = time.Now()
	err = parallel(t, "ServiceImports + EndpointSlices", d.services, workers, func(i int) error {
		ns := d.namespace(i)
		cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		si := &mcs.ServiceImport{
			ObjectMeta: metav1.ObjectMeta{Name: d.service(i), Namespace: ns},
			Spec: mcs.ServiceImportSpec{Type: mcs.Headless,
				Ports: []mcs.ServicePort{{Name: portName, Protocol: corev1.ProtocolTCP, Port: svcPort}}},
		}
		if _, err := mc.MulticlusterV1alpha1().ServiceImports(ns).Create(cx, si, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("ServiceImport %s/%s: %w", ns, si.Name, err)
		}
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: d.service(i) + "-" + d.cluster, Namespace: ns, Labels: map[string]string{
				mcs.LabelServiceName: d.service(i), mcs.LabelSourceCluster: d.cluster,
				discoveryv1.LabelManagedBy: "mcs-bench",
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(targetPort))}},
		}
		for j := 0; j < d.endpoints; j++ {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses: []string{d.ip(i, j).String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			})
		}
		if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(cx, es, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("EndpointSlice %s/%s: %w", ns, es.Name, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("creating MCS objects: %v", err)
	}
	st.Imports, st.Slices, st.MCSTook = d.services, d.services, time.Since(start)
	t.Logf("created %d ServiceImports and %d EndpointSlices in %s", st.Imports, st.Slices, st.MCSTook.Round(time.Millisecond))
	return st
}

// writeHostsFile writes every service name with its endpoint IPs, one line
// per address, for the hosts plugin.
func (d dataset) writeHostsFile(path string) error {
	var b strings.Builder
	for i := 0; i < d.services; i++ {
		name := strings.TrimSuffix(d.qname(i), ".")
		for _, ip := range d.ips(i) {
			b.WriteString(ip + " " + name + "\n")
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeQueryFile writes one dnsperf line per service, in an order shuffled
// with a fixed seed: the same file for every contender. SRV questions use
// the _port._proto form.
func (d dataset) writeQueryFile(path, qtype string) error {
	order := rand.New(rand.NewPCG(20261122, 6)).Perm(d.services)
	var b strings.Builder
	for _, i := range order {
		name := d.qname(i)
		if qtype == "SRV" {
			name = "_" + portName + "._tcp." + name
		}
		b.WriteString(name + " " + qtype + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
