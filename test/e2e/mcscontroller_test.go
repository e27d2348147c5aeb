package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// mcsPropagation bounds how long a change in one cluster may take to reach
// the MCS objects of another: the annotator writes the Pods, the controller's
// peer watch sees them, the controller writes.
const mcsPropagation = 30 * time.Second

// mcsView reads what the controller keeps in cluster c for service ns/name.
type mcsView struct {
	imp     *mcsv1beta1.ServiceImport // nil: none
	derived *corev1.Service           // nil: none
	slices  []discoveryv1.EndpointSlice
}

func readMCS(c *harness.Cluster, ns, name string) (mcsView, error) {
	var v mcsView
	cx, cancel := ctxTimeout()
	defer cancel()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return v, err
	}
	u, err := dyn.Resource(schema.GroupVersionResource{Group: harness.MCSGroup, Version: "v1beta1", Resource: "serviceimports"}).
		Namespace(ns).Get(cx, name, metav1.GetOptions{})
	if err == nil {
		var si mcsv1beta1.ServiceImport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
			return v, err
		}
		v.imp = &si
	} else if !strings.Contains(err.Error(), "not found") {
		return v, err
	}
	if svc, err := c.Client.CoreV1().Services(ns).Get(cx, clusterset.DerivedServiceName(name), metav1.GetOptions{}); err == nil {
		v.derived = svc
	}
	list, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(cx, metav1.ListOptions{LabelSelector: mcsv1beta1.LabelServiceName + "=" + name})
	if err != nil {
		return v, err
	}
	v.slices = list.Items
	return v, nil
}

// addrsBy returns the endpoint addresses of the view's slices by source cluster, sorted.
func (v mcsView) addrsBy() map[string][]string {
	out := map[string][]string{}
	for _, s := range v.slices {
		cl := s.Labels[mcsv1beta1.LabelSourceCluster]
		for _, e := range s.Endpoints {
			out[cl] = append(out[cl], e.Addresses...)
		}
	}
	for _, a := range out {
		slices.Sort(a)
	}
	return out
}

func (v mcsView) String() string {
	if v.imp == nil {
		return fmt.Sprintf("no ServiceImport, %d slices", len(v.slices))
	}
	return fmt.Sprintf("ServiceImport type %s ports %v ips %v clusters %v; derived %v; slices %v",
		v.imp.Spec.Type, v.imp.Spec.Ports, v.imp.Spec.IPs, v.imp.Status.Clusters, v.derived != nil, v.addrsBy())
}

func eventuallyMCS(t *testing.T, c *harness.Cluster, ns, name, what string, ok func(mcsView) error) mcsView {
	t.Helper()
	deadline := time.Now().Add(mcsPropagation)
	for {
		v, err := readMCS(c, ns, name)
		if err == nil {
			err = ok(v)
		}
		if err == nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s in %s: %s: not within %v: %v (%v)", ns, name, c.Name, what, mcsPropagation, err, v)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mcsClusters starts clusters with the MCS CRDs and the namespace ns in each.
func mcsClusters(t *testing.T, ns string, names ...string) []*harness.Cluster {
	t.Helper()
	cs := harness.StartClusters(t, names...)
	for _, cl := range cs {
		cl.InstallMCSCRDs(t)
		cl.CreateNamespace(t, ns)
	}
	return cs
}

// TestMCSController: three real clusters, the real annotator in each, the
// MCS controller in edge-a (bin/mcs-annotator -mcs-controller) watching
// edge-b through a link that the test cuts, and edge-c directly; edge-a's
// real CoreDNS with both peers. ClusterIP and headless exports, the port
// union across the three clusters, each kind of conflict (type, port, a
// property) with Conflict=True naming the clusters that differ, the
// ClusterSetIP allocated through the derived Service and answered (never the
// Pods' addresses at the service name), the objects unchanged while the
// peer is cut and across a restart of the controller while it is, an
// ExternalName Service refused, an unexport from one cluster, then from all.
func TestMCSController(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator, harness.ToolCoreDNS)
	ns := "mcs-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:10]
	cs := mcsClusters(t, ns, "edge-a", "edge-b", "edge-c")
	a, b, c := cs[0], cs[1], cs[2]
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	http := tcpPort("http", 80, intstr.FromInt32(8080))

	// edge-a's exports are the oldest: web (http), api (http 80), kind
	// (ClusterIP), sticky (internalTrafficPolicy Cluster, the default).
	a.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http))
	a.CreateService(t, harness.ServiceObject(ns, "api", app("api"), http))
	a.CreateService(t, harness.ServiceObject(ns, "kind", app("kind"), http))
	a.CreateService(t, harness.ServiceObject(ns, "sticky", app("sticky"), http))
	for _, n := range []string{"web", "api", "kind", "sticky"} {
		a.CreateServiceExport(t, "v1beta1", ns, n)
	}
	plainPod(t, a, ns, "web-a1", "10.244.1.1", app("web"))
	plainPod(t, a, ns, "api-a1", "10.244.1.2", app("api"))
	plainPod(t, a, ns, "kind-a1", "10.244.1.3", app("kind"))
	plainPod(t, a, ns, "sticky-a1", "10.244.1.4", app("sticky"))
	time.Sleep(1100 * time.Millisecond) // the other clusters' exports are younger, to the second
	// edge-b: web (http and metrics), api with another port for "http" (a
	// port conflict), db headless.
	b.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http, tcpPort("metrics", 9090, intstr.FromInt32(9090))))
	b.CreateService(t, harness.ServiceObject(ns, "api", app("api"), tcpPort("http", 81, intstr.FromInt32(8081))))
	db := harness.ServiceObject(ns, "db", app("db"), tcpPort("pg", 5432, intstr.FromInt32(5432)))
	db.Spec.ClusterIP = corev1.ClusterIPNone
	b.CreateService(t, db)
	for _, n := range []string{"web", "api", "db"} {
		b.CreateServiceExport(t, "v1beta1", ns, n)
	}
	plainPod(t, b, ns, "web-b1", "10.244.2.1", app("web"), containerPort("http", 8080), containerPort("metrics", 9090))
	plainPod(t, b, ns, "api-b1", "10.244.2.2", app("api"))
	plainPod(t, b, ns, "db-b1", "10.244.2.3", app("db"))
	// edge-c: web (http and grpc), kind headless (a type conflict), sticky
	// with internalTrafficPolicy Local (a property conflict), ext an
	// ExternalName.
	c.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http, tcpPort("grpc", 9000, intstr.FromInt32(9000))))
	kind := harness.ServiceObject(ns, "kind", app("kind"), http)
	kind.Spec.ClusterIP = corev1.ClusterIPNone
	c.CreateService(t, kind)
	sticky := harness.ServiceObject(ns, "sticky", app("sticky"), http)
	local := corev1.ServiceInternalTrafficPolicyLocal
	sticky.Spec.InternalTrafficPolicy = &local
	c.CreateService(t, sticky)
	ext := harness.ServiceObject(ns, "ext", app("ext"), http)
	ext.Spec.Type, ext.Spec.ExternalName = corev1.ServiceTypeExternalName, "backend.example.com"
	c.CreateService(t, ext)
	for _, n := range []string{"web", "kind", "sticky", "ext"} {
		c.CreateServiceExport(t, "v1beta1", ns, n)
	}
	plainPod(t, c, ns, "web-c1", "10.244.3.1", app("web"), containerPort("http", 8080), containerPort("grpc", 9000))
	plainPod(t, c, ns, "kind-c1", "10.244.3.3", app("kind"))
	plainPod(t, c, ns, "sticky-c1", "10.244.3.4", app("sticky"))
	plainPod(t, c, ns, "ext-c1", "10.244.3.5", app("ext"))

	startAnnotator(t, b, "--cluster", "edge-b", "--leader-elect=false")
	startAnnotator(t, c, "--cluster", "edge-c", "--leader-elect=false")
	// edge-a's CoreDNS starts before the controller: web is exported as
	// ClusterSetIP, so its name never answers the Pods' addresses, before
	// or after its ClusterSetIP is allocated.
	d := harness.StartCoreDNS(t, peersCorefile, map[string]string{"KUBECONFIG": a.Kubeconfig, "PEERB": b.Kubeconfig, "PEERC": c.Kubeconfig, "EXTRA": ""})
	name := svc("web", ns)
	stopWatch := watchNoPodAddrs(t, d, name)
	peer := harness.StartProxy(t, b.APIServerAddr())
	controllerArgs := []string{"--leader-elect=false", "-mcs-controller", "-peer", "edge-b=" + b.KubeconfigVia(t, peer), "-peer", "edge-c=" + c.Kubeconfig}
	ctl := startAnnotator(t, a, controllerArgs...)

	web := eventuallyMCS(t, a, ns, "web", "ClusterSetIP import of the three clusters", func(v mcsView) error {
		switch {
		case v.imp == nil:
			return fmt.Errorf("no ServiceImport")
		case v.imp.Spec.Type != mcsv1beta1.ClusterSetIP:
			return fmt.Errorf("type %s", v.imp.Spec.Type)
		case len(v.imp.Spec.Ports) != 3 || v.imp.Spec.Ports[0].Name != "grpc" || v.imp.Spec.Ports[1].Name != "http" || v.imp.Spec.Ports[2].Name != "metrics":
			return fmt.Errorf("ports %v, want the union grpc, http, metrics", v.imp.Spec.Ports)
		case len(v.imp.Status.Clusters) != 3:
			return fmt.Errorf("clusters %v", v.imp.Status.Clusters)
		case v.derived == nil || len(v.imp.Spec.IPs) == 0 || v.imp.Spec.IPs[0] != v.derived.Spec.ClusterIP:
			return fmt.Errorf("ips %v, derived Service %v", v.imp.Spec.IPs, v.derived)
		}
		got := v.addrsBy()
		if !slices.Equal(got["edge-a"], []string{"10.244.1.1"}) || !slices.Equal(got["edge-b"], []string{"10.244.2.1"}) || !slices.Equal(got["edge-c"], []string{"10.244.3.1"}) {
			return fmt.Errorf("endpoints by cluster %v", got)
		}
		return nil
	})
	if _, err := netip.ParseAddr(web.imp.Spec.IPs[0]); err != nil {
		t.Errorf("ClusterSetIP %q: %v", web.imp.Spec.IPs[0], err)
	}
	if d := web.derived; d.Spec.Selector != nil || len(d.OwnerReferences) != 1 || d.OwnerReferences[0].UID != web.imp.UID {
		t.Errorf("derived Service: selector %v, owners %v (import UID %s)", d.Spec.Selector, d.OwnerReferences, web.imp.UID)
	}
	if len(web.imp.Spec.IPFamilies) == 0 || web.imp.Spec.IPFamilies[0] != web.derived.Spec.IPFamilies[0] {
		t.Errorf("ipFamilies %v, derived %v", web.imp.Spec.IPFamilies, web.derived.Spec.IPFamilies)
	}
	for _, s := range web.slices {
		l := s.Labels
		if l[discoveryv1.LabelManagedBy] != clusterset.ManagedBy || l[discoveryv1.LabelServiceName] != web.derived.Name {
			t.Errorf("slice %s labels %v", s.Name, l)
		}
		for _, p := range s.Ports {
			if l[mcsv1beta1.LabelSourceCluster] == "edge-b" && *p.Name == "metrics" && *p.Port != 9090 {
				t.Errorf("slice %s: metrics port %d", s.Name, *p.Port)
			}
		}
	}
	// Ports not the same in every export: the union, and a PortConflict
	// saying what each cluster lacks.
	for _, cd := range wantConditions(t, a, ns, "web", cond{"Conflict", metav1.ConditionTrue, "PortConflict"}, cond{"Ready", metav1.ConditionTrue, "Exported"}) {
		if want := "cluster edge-a does not export grpc 9000/TCP, metrics 9090/TCP"; cd.Type == "Conflict" && !strings.Contains(cd.Message, want) {
			t.Errorf("web: Conflict message %q, want it to say %q", cd.Message, want)
		}
	}

	// Our CoreDNS in edge-a answers the ClusterSetIP the controller
	// allocated, and SRV in service form, for every port of the union.
	vip := web.imp.Spec.IPs[0]
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: name, Type: dns.TypeA}, hasAddrs(vip))
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: "_metrics._tcp." + name, Type: dns.TypeSRV}, hasSRVs("9090 "+name))
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: name, Type: dns.TypeSRV}, hasSRVs("80 "+name, "9090 "+name, "9000 "+name))
	stopWatch()
	// The headless import: edge-b's endpoint, SRV in endpoint form.
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: svc("db", ns), Type: dns.TypeA}, hasAddrs("10.244.2.3"))
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: "_pg._tcp." + svc("db", ns), Type: dns.TypeSRV},
		hasSRVs("5432 "+dashed("10.244.2.3")+".edge-b."+svc("db", ns)))

	// Each kind of conflict: Conflict=True on edge-a's (the oldest) export,
	// the reason its kind, the message naming the cluster that differs.
	for _, cf := range []struct{ name, reason, cluster string }{
		{"api", "PortConflict", "edge-b"},
		{"kind", "TypeConflict", "edge-c"},
		{"sticky", "InternalTrafficPolicyConflict", "edge-c"},
	} {
		conds := wantConditions(t, a, ns, cf.name, cond{"Conflict", metav1.ConditionTrue, cf.reason})
		for _, cd := range conds {
			if cd.Type == "Conflict" && !strings.Contains(cd.Message, cf.cluster) {
				t.Errorf("%s: Conflict message %q does not name the cluster that differs (%s)", cf.name, cd.Message, cf.cluster)
			}
		}
	}
	eventuallyMCS(t, a, ns, "api", "the oldest export's port", func(v mcsView) error {
		if v.imp == nil || len(v.imp.Spec.Ports) != 1 || v.imp.Spec.Ports[0].Port != 80 || len(v.imp.Status.Clusters) != 2 {
			return fmt.Errorf("want port http 80 from edge-a, both clusters")
		}
		return nil
	})
	eventuallyMCS(t, a, ns, "kind", "the oldest export's type", func(v mcsView) error {
		if v.imp == nil || v.imp.Spec.Type != mcsv1beta1.ClusterSetIP || len(v.imp.Spec.IPs) == 0 {
			return fmt.Errorf("want ClusterSetIP (edge-a's) with an IP")
		}
		return nil
	})
	eventuallyMCS(t, a, ns, "sticky", "the oldest export's traffic policy", func(v mcsView) error {
		if v.imp == nil || (v.imp.Spec.InternalTrafficPolicy != nil && *v.imp.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster) {
			return fmt.Errorf("want edge-a's internalTrafficPolicy (Cluster)")
		}
		return nil
	})

	eventuallyMCS(t, a, ns, "db", "headless import of edge-b", func(v mcsView) error {
		if v.imp == nil || v.imp.Spec.Type != mcsv1beta1.Headless || len(v.imp.Spec.IPs) > 0 || v.derived != nil {
			return fmt.Errorf("want a Headless import, no IPs, no derived Service")
		}
		if got := v.addrsBy()["edge-b"]; !slices.Equal(got, []string{"10.244.2.3"}) {
			return fmt.Errorf("endpoints %v", got)
		}
		for _, s := range v.slices {
			if _, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
				return fmt.Errorf("a headless import's slice names a Service: %v", s.Labels)
			}
		}
		return nil
	})
	// ExternalName: refused in edge-c, so imported nowhere.
	wantConditions(t, c, ns, "ext", cond{"Valid", metav1.ConditionFalse, "InvalidServiceType"})
	if v, err := readMCS(a, ns, "ext"); err != nil || v.imp != nil || len(v.slices) > 0 {
		t.Errorf("an ExternalName export was imported: %v (%v)", v, err)
	}
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: svc("ext", ns), Type: dns.TypeA}, isNXDOMAIN)

	// The peer is cut: edge-b's share stays exactly as it was, also after the
	// controller restarts while the peer is still cut; the answers too.
	watched := []string{"web", "api", "db", "kind", "sticky"}
	before := map[string]string{}
	for _, n := range watched {
		v, err := readMCS(a, ns, n)
		if err != nil {
			t.Fatal(err)
		}
		before[n] = v.String()
	}
	same := func(when string) {
		t.Helper()
		for _, n := range watched {
			v, err := readMCS(a, ns, n)
			if err != nil {
				t.Fatal(err)
			}
			if v.String() != before[n] {
				t.Fatalf("%s: %s changed:\n%s\nwas\n%s", when, n, v, before[n])
			}
		}
		m, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA})
		if err == nil {
			err = hasAddrs(vip)(m)
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", when, name, err)
		}
	}
	peer.Cut(t)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		same("while the peer is cut")
		time.Sleep(500 * time.Millisecond)
	}
	ctl.Kill(t, syscall.SIGTERM)
	ctl = startAnnotator(t, a, controllerArgs...)
	eventuallyMetric(t, ctl, "mcs_controller_reconcile_seconds_count", "> 0", func(v float64) bool { return v > 0 })
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		same("after the controller restarted while the peer is cut")
		time.Sleep(500 * time.Millisecond)
	}

	// The link comes back; edge-b unexports db: its import goes.
	peer.Restore(t)
	b.DeleteServiceExport(t, ns, "db")
	eventuallyMCS(t, a, ns, "db", "the import of a service no cluster exports is deleted", func(v mcsView) error {
		if v.imp != nil || len(v.slices) > 0 {
			return fmt.Errorf("still there")
		}
		return nil
	})
	// edge-a unexports web: edge-b's and edge-c's shares are left, the
	// ClusterSetIP kept.
	a.DeleteServiceExport(t, ns, "web")
	eventuallyMCS(t, a, ns, "web", "edge-a's share gone", func(v mcsView) error {
		if v.imp == nil || len(v.imp.Status.Clusters) != 2 || v.imp.Status.Clusters[0].Cluster != "edge-b" || v.imp.Status.Clusters[1].Cluster != "edge-c" {
			return fmt.Errorf("want the import of edge-b and edge-c")
		}
		if got := v.addrsBy(); len(got["edge-a"]) > 0 {
			return fmt.Errorf("edge-a's endpoints remain: %v", got)
		}
		if len(v.imp.Spec.IPs) == 0 || v.imp.Spec.IPs[0] != vip {
			return fmt.Errorf("ClusterSetIP %v, want %s kept", v.imp.Spec.IPs, vip)
		}
		return nil
	})
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: name, Type: dns.TypeA}, hasAddrs(vip))
	// ... and then every cluster: the import, its slices and its name go.
	b.DeleteServiceExport(t, ns, "web")
	c.DeleteServiceExport(t, ns, "web")
	eventuallyMCS(t, a, ns, "web", "the import of a service no cluster exports is deleted", func(v mcsView) error {
		if v.imp != nil || len(v.slices) > 0 || v.derived != nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	eventuallyWithin(t, d, mcsPropagation, harness.Query{Name: name, Type: dns.TypeA}, isNXDOMAIN)
	if v := metric(t, ctl, `mcs_controller_writes_total{kind="endpointslice",result="error"}`); v != 0 {
		t.Errorf("%v failed slice writes", v)
	}
}

// watchNoPodAddrs asks d for name's A records every 100 ms until the
// returned stop is called, and fails the test if any answer holds a Pod's
// address (10.244.0.0/16): a ClusterSetIP service's name never does.
func watchNoPodAddrs(t *testing.T, d *harness.CoreDNS, name string) (stop func()) {
	t.Helper()
	pods := netip.MustParsePrefix("10.244.0.0/16")
	done := make(chan struct{})
	finished := make(chan struct{})
	var bad []string
	asked := 0
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			m, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA})
			if err != nil {
				continue
			}
			asked++
			for _, rr := range m.Answer {
				if a, ok := rr.(*dns.A); ok {
					if ip, _ := netip.AddrFromSlice(a.A); pods.Contains(ip.Unmap()) {
						bad = append(bad, ip.String())
					}
				}
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			<-finished
			if len(bad) > 0 {
				t.Errorf("%s answered Pod addresses %v (in %d answers)", name, bad, asked)
			}
			t.Logf("%s: %d answers watched, none with a Pod's address", name, asked)
		})
	}
	t.Cleanup(stop)
	return stop
}
