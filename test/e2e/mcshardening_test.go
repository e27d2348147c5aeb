package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// What a hostile or unlucky peer can make the MCS controller write, against
// real API servers: the peer's Pods carry hand-written export annotations
// (no annotator in the peer), read by the controller of edge-a.

// peerEntry is an export entry of cluster edge-b for service name of ns.
func peerEntry(ns, name, typ string, port int32) annotation.Export {
	return annotation.Export{Name: name, Namespace: ns, Cluster: "edge-b",
		Ports:   []annotation.Port{{Name: "http", Port: port, TargetPort: 8080, Protocol: "TCP"}},
		Service: annotation.Service{Type: typ}}
}

// peerPod creates in c a Running, Ready exporter Pod with ip carrying the
// entries as its export annotation.
func peerPod(t *testing.T, c *harness.Cluster, ns, name, ip string, entries ...annotation.Export) {
	t.Helper()
	raw, err := annotation.MarshalExports(entries)
	if err != nil {
		t.Fatal(err)
	}
	c.CreatePodObject(t, harness.Pod{Name: name, Labels: map[string]string{harness.ExporterLabel: "true"},
		Annotations: map[string]string{harness.ExportAnnotation: raw}}.Object(ns))
	c.SetPodReady(t, ns, name, true, ip)
}

// counter is the value of a counter of the annotator's /metrics with these
// label values (0 when absent).
func counter(t *testing.T, a *harness.Annotator, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := a.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	f := fams[name]
	if f == nil {
		return 0
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		ok := true
		for _, l := range m.GetLabel() {
			if v, want := labels[l.GetName()]; want && v != l.GetValue() {
				ok = false
			}
		}
		if ok {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// TestMCSHardeningPoisonedService: one peer exports a service whose
// endpoints include addresses the API server refuses in an EndpointSlice
// (127.0.0.1, ::1, 0.0.0.0, 169.254.169.254, 224.0.0.1) beside a healthy
// one, a service whose name starts with a digit (its derived Service's name
// must not), and a service in a namespace whose ResourceQuota makes the API
// server refuse every Service (a failure no check before writing can
// foresee). The healthy endpoint of the poisoned slice is written; the
// digit-named service gets its ClusterSetIP; the refused one is retried on
// its own backoff, not with every other change: twenty services exported
// one after the other are each written while it is tried only a few times
// (a loop that tried every failing service again at each reconcile, and
// backed off as a whole, would try it at least twenty times).
func TestMCSHardeningPoisonedService(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns, qns := "mcs-hard-poison", "mcs-hard-quota"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	a.CreateNamespace(t, qns)
	b.CreateNamespace(t, qns)
	cx, cancel := ctxTimeout()
	defer cancel()
	none := corev1.ResourceList{corev1.ResourceServices: resource.MustParse("0")}
	q, err := a.Client.CoreV1().ResourceQuotas(qns).Create(cx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-services"}, Spec: corev1.ResourceQuotaSpec{Hard: none},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No quota controller runs: its status is written here, as it would
	// (the admission plugin enforces what the status says).
	q.Status = corev1.ResourceQuotaStatus{Hard: none, Used: none}
	if _, err := a.Client.CoreV1().ResourceQuotas(qns).UpdateStatus(cx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	web := peerEntry(ns, "web", annotation.TypeClusterSetIP, 80)
	for i, ip := range []string{"10.244.2.1", "127.0.0.1", "::1", "0.0.0.0", "169.254.169.254", "224.0.0.1"} {
		peerPod(t, b, ns, fmt.Sprintf("web-b%d", i), ip, web)
	}
	peerPod(t, b, ns, "digit-b1", "10.244.2.9", peerEntry(ns, "1web", annotation.TypeClusterSetIP, 80))
	peerPod(t, b, qns, "stuck-b1", "10.244.2.8", peerEntry(qns, "stuck", annotation.TypeClusterSetIP, 80))

	ctl := startAnnotator(t, a, "--leader-elect=false", "-mcs-controller", "-peer", "edge-b="+b.Kubeconfig)
	withIP := func(want []string) func(v mcsView) error {
		return func(v mcsView) error {
			if v.imp == nil || v.derived == nil || len(v.imp.Spec.IPs) == 0 || v.imp.Spec.IPs[0] != v.derived.Spec.ClusterIP {
				return fmt.Errorf("want a ClusterSetIP import with its derived Service's IP")
			}
			if got := v.addrsBy()["edge-b"]; !slices.Equal(got, want) {
				return fmt.Errorf("edge-b's endpoints %v, want %v", got, want)
			}
			return nil
		}
	}
	eventuallyMCS(t, a, ns, "web", "the healthy endpoint of the poisoned slice", withIP([]string{"10.244.2.1"}))
	eventuallyMCS(t, a, ns, "1web", "a ClusterSetIP for a name starting with a digit", withIP([]string{"10.244.2.9"}))
	eventuallyMCS(t, a, qns, "stuck", "an import without IPs", func(v mcsView) error {
		if v.imp == nil || len(v.imp.Spec.IPs) > 0 || v.derived != nil {
			return fmt.Errorf("want the import, no IPs, no derived Service")
		}
		return nil
	})
	eventuallyMetric(t, ctl, "mcs_controller_writes_total", "a failed derived Service write", func(float64) bool {
		return counter(t, ctl, "mcs_controller_writes_total", map[string]string{"kind": "service", "result": "error"}) > 0
	})

	const n = 20
	for i := range n {
		name := fmt.Sprintf("h-%02d", i)
		ip := fmt.Sprintf("10.244.4.%d", i+1)
		peerPod(t, b, ns, name+"-b1", ip, peerEntry(ns, name, annotation.TypeClusterSetIP, 80))
		eventuallyMCS(t, a, ns, name, "a healthy service beside the failing one", withIP([]string{ip}))
	}
	failed := counter(t, ctl, "mcs_controller_writes_total", map[string]string{"kind": "service", "result": "error"})
	if failed >= n {
		t.Errorf("the refused derived Service was tried %v times while %d other services were written: it is retried with them", failed, n)
	}
	if e := counter(t, ctl, "mcs_controller_writes_total", map[string]string{"kind": "endpointslice", "result": "error"}); e > 0 {
		t.Errorf("%v failed EndpointSlice writes: refused addresses reached the API server", e)
	}
	if r := counter(t, ctl, "mcs_controller_refused_total", map[string]string{"reason": "RefusedAddress"}); r < 1 {
		t.Errorf("the refused addresses were not counted")
	}
	t.Logf("the refused derived Service was tried %v times", failed)
}

// TestMCSHardeningFlappingPeer: a peer's services flip between ClusterSetIP
// and Headless, and between two ports, as fast as the test can patch their
// Pods. Each service's writes are damped (they wait longer the more it
// keeps changing), and its derived Service is kept across the flips, so its
// ClusterSetIP stays the same and nothing is allocated again: the writes
// are counted, the derived Services' UIDs and ClusterIPs compared.
func TestMCSHardeningFlappingPeer(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "mcs-hard-flap"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	const services, rounds = 10, 60
	name := func(i int) string { return fmt.Sprintf("flap-%d", i) }
	for i := range services {
		peerPod(t, b, ns, name(i)+"-b1", fmt.Sprintf("10.244.5.%d", i+1), peerEntry(ns, name(i), annotation.TypeClusterSetIP, 80))
	}
	ctl := startAnnotator(t, a, "--leader-elect=false", "-mcs-controller", "-peer", "edge-b="+b.Kubeconfig)
	type alloc struct {
		uid types.UID
		ip  string
	}
	first := map[string]alloc{}
	settled := func(i int) func(v mcsView) error {
		return func(v mcsView) error {
			if v.imp == nil || v.imp.Spec.Type != mcsv1beta1.ClusterSetIP || v.derived == nil || len(v.imp.Spec.IPs) == 0 ||
				v.imp.Spec.IPs[0] != v.derived.Spec.ClusterIP || len(v.imp.Spec.Ports) != 1 || v.imp.Spec.Ports[0].Port != 80 {
				return fmt.Errorf("want a ClusterSetIP import of port 80 with its derived Service's IP")
			}
			return nil
		}
	}
	for i := range services {
		v := eventuallyMCS(t, a, ns, name(i), "the first import", settled(i))
		first[name(i)] = alloc{v.derived.UID, v.derived.Spec.ClusterIP}
	}
	writes := func() float64 { return counter(t, ctl, "mcs_controller_writes_total", nil) }
	before := writes()
	deletes := counter(t, ctl, "mcs_controller_writes_total", map[string]string{"kind": "service_delete"})

	for r := range rounds {
		typ, port := annotation.TypeHeadless, int32(81)
		if r%2 == 1 || r == rounds-1 {
			typ, port = annotation.TypeClusterSetIP, 80
		}
		for i := range services {
			raw, err := annotation.MarshalExports([]annotation.Export{peerEntry(ns, name(i), typ, port)})
			if err != nil {
				t.Fatal(err)
			}
			b.SetPodAnnotation(t, ns, name(i)+"-b1", harness.ExportAnnotation, raw)
		}
		time.Sleep(150 * time.Millisecond) // more than the controller's Interval: each flip can be seen
	}
	// Settled back where it began: the same derived Services, the same ClusterSetIPs.
	for i := range services {
		v := eventuallyMCS(t, a, ns, name(i), "settled after the flips", settled(i))
		if got := (alloc{v.derived.UID, v.derived.Spec.ClusterIP}); got != first[name(i)] {
			t.Errorf("%s: derived Service %v, was %v: allocated again", name(i), got, first[name(i)])
		}
	}
	if d := counter(t, ctl, "mcs_controller_writes_total", map[string]string{"kind": "service_delete"}) - deletes; d > 0 {
		t.Errorf("%v derived Services deleted during the flips", d)
	}
	// Undamped, a flip seen is up to four writes per service (the import,
	// its status, the derived Service, the slice); damped, the flips of
	// one service are written a few times in all.
	w := writes() - before
	if limit := float64(services * rounds); w > limit {
		t.Errorf("%v writes for %d flips of %d services, want at most %v", w, rounds, services, limit)
	}
	t.Logf("%v writes for %d flips of %d services", w, rounds, services)
}
