package mcscontroller

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// attempts counts the write requests (failed ones included) that name one
// of names, since m.
func (e *env) attempts(m mark, names ...string) int {
	n := 0
	for _, list := range [][]clienttesting.Action{e.client.Actions()[m.typed:], e.dyn.Actions()[m.dynamic:]} {
		for _, a := range list {
			var name string
			switch x := a.(type) {
			case clienttesting.PatchAction:
				name = x.GetName()
			case clienttesting.DeleteAction:
				name = x.GetName()
			default:
				continue
			}
			if slices.Contains(names, name) {
				n++
			}
		}
	}
	return n
}

// A service whose writes fail is tried again after its own backoff: the
// next reconcile, for a change of another service, writes that change and
// does not try the failing one again, and its error does not hide the
// other's writes.
func TestFailingServiceDoesNotHoldOthers(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())})
	bad := clusterset.DerivedServiceName("bad")
	e.client.PrependReactor("patch", "services", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.PatchAction).GetName() == bad {
			return true, nil, fmt.Errorf("refused by the test")
		}
		return false, nil, nil
	})
	e.ctl.retry = workqueue.NewTypedItemExponentialFailureRateLimiter[clusterset.Key](time.Hour, time.Hour)
	e.table.Upsert(exporter("a", "bad", "10.0.0.9", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err == nil || !strings.Contains(err.Error(), "ns/bad") {
		t.Fatalf("first reconcile: %v, want bad's error", err)
	}
	if len(e.slicesBy("web")["a"]) != 1 {
		t.Fatalf("web not written beside the failing service")
	}

	m := e.mark()
	web := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	web.Ready = false
	e.table.Upsert(web)
	if err := e.reconcile(); err != nil {
		t.Errorf("reconcile of web's change: %v", err)
	}
	if n := e.attempts(m, "bad", bad); n != 0 {
		t.Errorf("bad tried again %d times before its backoff passed", n)
	}
	if got := e.writesSince(m); !slices.Equal(got, []string{"patch endpointslices "}) {
		t.Errorf("writes for web's change: %v", got)
	}
}

// Endpoint addresses the API server refuses in an EndpointSlice (or no
// service should send to) are left out, the cluster's other endpoints
// written; logged and counted once while they stay.
func TestRefusedAddressesLeftOut(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())})
	for i, ip := range []string{"10.0.1.1", "127.0.0.1", "::1", "0.0.0.0", "169.254.169.254", "224.0.0.1", "fd00::7"} {
		p := exporter("b", "web", ip, annotation.TypeClusterSetIP)
		p.Name = fmt.Sprintf("web-b-%d", i)
		e.table.Upsert(p)
	}
	e.start(false)
	e.waitSynced()
	for range 2 {
		if err := e.reconcile(); err != nil {
			t.Fatal(err)
		}
	}
	got := e.slicesBy("web")["b"]
	slices.Sort(got)
	if !slices.Equal(got, []string{"10.0.1.1", "fd00::7"}) {
		t.Errorf("b's endpoints %v, want 10.0.1.1 and fd00::7", got)
	}
	if n := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonAddress)); n != 1 {
		t.Errorf("refused addresses counted %v times, want once", n)
	}
	if len(e.derivedServices()) != 1 {
		t.Errorf("no derived Service for web")
	}
}

// A derived Service the API server would refuse (two clusters' ports: one
// unnamed, one named) is not written: the import is, without IPs.
func TestInvalidDerivedServiceNotWritten(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())})
	a := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	a.Exports[0].Ports[0].Name = ""
	a.Exports[0].ExportedAt = "2026-11-25T12:00:00Z"
	b := exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP)
	b.Exports[0].Ports[0].Port = 81
	e.table.Upsert(a)
	e.table.Upsert(b)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if len(e.derivedServices()) != 0 {
		t.Errorf("a derived Service of an unnamed and a named port was written")
	}
	if e.serviceImport("web") == nil {
		t.Errorf("no import")
	}
	if n := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonInvalidService)); n != 1 {
		t.Errorf("refused derived Services counted %v, want 1", n)
	}
}

// pending is a Pod of cluster in namespace ns without an IP (never
// scheduled) exporting services name-0 ... name-(n-1) as ClusterSetIP.
func pending(cluster, ns, name string, n int) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: ns}, Name: name + "-pod"}
	for i := range n {
		p.Exports = append(p.Exports, annotation.Export{Name: fmt.Sprintf("%s-%d", name, i), Namespace: ns, Cluster: cluster,
			Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}, Service: annotation.Service{Type: annotation.TypeClusterSetIP}})
	}
	return p
}

func (e *env) importNames(ns string) []string {
	e.t.Helper()
	l, err := e.dyn.Resource(importsGVR).Namespace(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, u := range l.Items {
		out = append(out, u.GetName())
	}
	slices.Sort(out)
	return out
}

// A tenant's Pods that never got an IP make no derived Service (no
// ClusterSetIP); a namespace gets at most its cap of imports, the others
// are refused (counted, an Event on their ServiceExport) and admitted when
// room is made, the oldest first; everything goes once the Pods do.
func TestImportCapsAndPendingPods(t *testing.T) {
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": exportsGVR.GroupVersion().String(), "kind": "ServiceExport",
		"metadata": map[string]any{"namespace": "ns", "name": "t-9"},
	}}
	rec := record.NewFakeRecorder(100)
	e := newEnv(t, Config{MaxImportsPerNamespace: 5, Recorder: rec}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, se)
	tenant := pending("b", "ns", "t", 10)
	e.table.Upsert(tenant)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := e.importNames("ns"); !slices.Equal(got, []string{"t-0", "t-1", "t-2", "t-3", "t-4"}) {
		t.Errorf("imports %v, want the first 5 by name", got)
	}
	if n := len(e.derivedServices()); n != 0 {
		t.Errorf("%d derived Services (ClusterSetIPs) for Pods without an address", n)
	}
	if v := testutil.ToFloat64(e.metrics.RefusedNow); v != 5 {
		t.Errorf("mcs_controller_refused_services %v, want 5", v)
	}
	if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonNamespaceCap)); v != 5 {
		t.Errorf("refused for the namespace cap counted %v, want 5", v)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, "Warning "+ReasonNamespaceCap) {
			t.Errorf("event %q", ev)
		}
	default:
		t.Errorf("no Event on t-9's ServiceExport")
	}
	// Nothing changes: nothing is counted again.
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonNamespaceCap)); v != 5 {
		t.Errorf("refused counted again without a change: %v", v)
	}

	// A legitimate export, older than the tenant's: refused too (what is
	// imported stays), admitted first once the tenant's Pod goes.
	web := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	web.Exports[0].ExportedAt = "2020-01-01T00:00:00Z"
	e.table.Upsert(web)
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if e.serviceImport("web") != nil || len(e.importNames("ns")) != 5 {
		t.Errorf("imports %v: an existing import made room for a new one", e.importNames("ns"))
	}
	// What is deleted is found in the informers: they hold the imports first.
	e.poll("the import informer to hold the imports", func() bool {
		l, err := e.ctl.imports.List(labels.Everything())
		return err == nil && len(l) == 5
	})
	e.table.Delete(tenant.Key())
	for range 2 { // the room made is seen by the next reconcile
		if err := e.reconcile(); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.importNames("ns"); !slices.Equal(got, []string{"web"}) {
		t.Errorf("imports %v once the tenant's Pod is gone, want web alone", got)
	}
	if v := testutil.ToFloat64(e.metrics.Imports); v != 1 {
		t.Errorf("mcs_controller_serviceimports %v, want 1", v)
	}
	if v := testutil.ToFloat64(e.metrics.RefusedNow); v != 0 {
		t.Errorf("mcs_controller_refused_services %v, want 0", v)
	}
}

// A source cluster takes part in at most its cap of imports across
// namespaces; another cluster's exports are not held back by it.
func TestClusterCap(t *testing.T) {
	ns2 := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns2"}}
	e := newEnv(t, Config{MaxImportsPerCluster: 6}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, ns2)
	e.table.Upsert(pending("b", "ns", "x", 4))
	e.table.Upsert(pending("b", "ns2", "y", 4))
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if n := len(e.importNames("ns")) + len(e.importNames("ns2")); n != 7 {
		t.Errorf("%d imports (%v %v), want b's 6 and web", n, e.importNames("ns"), e.importNames("ns2"))
	}
	if e.serviceImport("web") == nil {
		t.Errorf("a's web held back by b's cap")
	}
	if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonClusterCap)); v != 2 {
		t.Errorf("refused for the cluster cap counted %v, want 2", v)
	}
}

// No import is written to kube-system (nor the other refused namespaces)
// unless the operator says so.
func TestRefusedNamespaces(t *testing.T) {
	for _, c := range []struct {
		name    string
		refused []string
		want    bool
	}{{"default", nil, false}, {"none refused", []string{}, true}} {
		t.Run(c.name, func(t *testing.T) {
			ks := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}
			e := newEnv(t, Config{RefusedNamespaces: c.refused}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, ks)
			e.table.Upsert(in("kube-system", exporter("b", "dns", "10.0.1.1", annotation.TypeClusterSetIP)))
			e.table.Upsert(exporter("b", "web", "10.0.1.2", annotation.TypeClusterSetIP))
			e.start(false)
			e.waitSynced()
			// (Not e.reconcile: it waits for the slices of ns alone.)
			if err := e.ctl.Reconcile(e.ctx); err != nil {
				t.Fatal(err)
			}
			if got := len(e.importNames("kube-system")) == 1; got != c.want {
				t.Errorf("import in kube-system: %v, want %v", got, c.want)
			}
			if e.serviceImport("web") == nil {
				t.Errorf("web not imported")
			}
			want := 1.0
			if c.want {
				want = 0
			}
			if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonNamespace)); v != want {
				t.Errorf("refused namespace counted %v, want %v", v, want)
			}
		})
	}
}

// A Service or EndpointSlice of the name the controller would write for a
// service, but not made by it for that service (another implementation's,
// or one of its own for another service or cluster), is left alone: no
// write over it, the import written without IPs, counted.
func TestNameTakenLeftAlone(t *testing.T) {
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: clusterset.DerivedServiceName("web"),
		Labels: map[string]string{clusterset.LabelManagedBy: clusterset.ManagedBy, mcsv1beta1.LabelServiceName: "other"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.7.7", ClusterIPs: []string{"10.96.7.7"}}}
	im := clusterset.Merge([]clusterset.Export{{Cluster: "b", Type: mcsv1beta1.Headless,
		Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}})
	want := clusterset.Slices(clusterset.Key{Namespace: "ns", Name: "db"}, "b", "", &im,
		[]clusterset.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.0.1.2")}, Ports: []clusterset.EndpointPort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080}}}},
		metav1.OwnerReference{})[0]
	other := want.DeepCopy()
	other.Labels = clusterset.SliceLabels(clusterset.Key{Namespace: "ns", Name: "db"}, "c", "")
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, theirs, other)
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	db := exporter("b", "db", "10.0.1.2", annotation.TypeHeadless)
	e.table.Upsert(db)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	for _, w := range e.client.Actions() {
		if p, ok := w.(clienttesting.PatchAction); ok && (p.GetName() == theirs.Name || p.GetName() == other.Name) {
			t.Errorf("written over an object of another service: %s %s", p.GetResource().Resource, p.GetName())
		}
	}
	if ips, _, _ := unstructured.NestedStringSlice(e.serviceImport("web").Object, "spec", "ips"); len(ips) > 0 {
		t.Errorf("web's import took the other service's ClusterIPs %v", ips)
	}
	if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(ReasonNameTaken)); v != 2 {
		t.Errorf("names taken counted %v, want 2", v)
	}
}

// Objects written under the names of an earlier version (a shorter hash)
// are deleted, and the service's objects written under the new names.
func TestOldNamesCleanedUp(t *testing.T) {
	k := clusterset.Key{Namespace: "ns", Name: "web"}
	oldSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-mcs-1a2b3c",
		Labels: map[string]string{clusterset.LabelManagedBy: clusterset.ManagedBy, mcsv1beta1.LabelServiceName: "web"}}}
	oldSlice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1a2b3c4d-0",
		Labels: clusterset.SliceLabels(k, "a", "web-mcs-1a2b3c")}, AddressType: discoveryv1.AddressTypeIPv4}
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())}, oldSvc, oldSlice)
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range e.derivedServices() {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, []string{clusterset.DerivedServiceName("web")}) {
		t.Errorf("derived Services %v", names)
	}
	for _, s := range e.slices() {
		if s.Name == oldSlice.Name {
			t.Errorf("the slice of the old name remains")
		}
	}
	if len(e.slicesBy("web")["a"]) != 1 {
		t.Errorf("web's slice not written")
	}
}

// A service that changes again soon after a write waits (Damp); the
// changes meanwhile are written together once it is due. A ClusterSetIP
// service that turns Headless keeps its derived Service, so it has the
// same ClusterSetIP when it turns back.
func TestDampingAndClusterSetIPKept(t *testing.T) {
	e := newEnv(t, Config{Damp: time.Hour, DampMax: time.Hour}, []*fakeSource{newSource("b", true, time.Now())})
	k := clusterset.Key{Namespace: "ns", Name: "web"}
	// Each step waits for the import informer to hold what was written:
	// the applied hash is compared with what it holds.
	reconcile := func() error {
		err := e.reconcile()
		e.poll("the import informer to see the writes", func() bool {
			o, err := e.ctl.imports.ByNamespace("ns").Get("web")
			want := e.serviceImport("web")
			return err == nil && want != nil && equalObjects(o.(*unstructured.Unstructured), want)
		})
		return err
	}
	flip := func(typ string, port int32) {
		p := exporter("b", "web", "10.0.1.1", typ)
		p.Exports[0].Ports[0].Port = port
		e.table.Upsert(p)
	}
	flip(annotation.TypeClusterSetIP, 80)
	e.start(false)
	e.waitSynced()
	if err := reconcile(); err != nil {
		t.Fatal(err)
	}
	ips := func() []string {
		v, _, _ := unstructured.NestedStringSlice(e.serviceImport("web").Object, "spec", "ips")
		return v
	}
	first := ips()
	if len(first) != 1 {
		t.Fatalf("ClusterSetIPs %v", first)
	}

	m := e.mark()
	for i := range 10 { // a flapping peer: type and ports
		if i%2 == 0 {
			flip(annotation.TypeHeadless, 81)
		} else {
			flip(annotation.TypeClusterSetIP, 80)
		}
		if err := reconcile(); err != nil {
			t.Fatal(err)
		}
	}
	if w := e.writesSince(m); len(w) > 0 {
		t.Errorf("writes within the damping window: %v", w)
	}
	if v := testutil.ToFloat64(e.metrics.Deferred); v != 10 {
		t.Errorf("deferred %v, want 10", v)
	}

	// Due: it is written as it is now (Headless), its derived Service kept.
	flip(annotation.TypeHeadless, 81)
	e.ctl.notBefore[k] = time.Now().Add(-time.Second)
	if err := reconcile(); err != nil {
		t.Fatal(err)
	}
	if typ, _, _ := unstructured.NestedString(e.serviceImport("web").Object, "spec", "type"); typ != "Headless" {
		t.Errorf("import type %s, want Headless", typ)
	}
	if len(e.derivedServices()) != 1 {
		t.Errorf("the derived Service went when the service turned Headless")
	}
	flip(annotation.TypeClusterSetIP, 80)
	e.ctl.notBefore[k] = time.Now().Add(-time.Second)
	if err := reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := ips(); !slices.Equal(got, first) {
		t.Errorf("ClusterSetIPs %v after the flip, want %v kept", got, first)
	}
	for _, w := range e.writesSince(m) {
		if strings.HasPrefix(w, "delete services") {
			t.Errorf("the derived Service was deleted")
		}
	}
}

// Each cluster's share of a service is paced on its own: a share written
// within Damp waits (its slice stays as stored, and the service is queued
// again for when it is due), while another cluster's share of the same
// service is written as it changes. Paced as a whole, one flapping cluster
// held back every other cluster's changes to the service (a relay hub's
// service of a thousand origins) for up to DampMax.
func TestDampingIsPerShare(t *testing.T) {
	now := time.Now()
	e := newEnv(t, Config{Damp: time.Hour, DampMax: time.Hour}, []*fakeSource{newSource("a", true, now), newSource("b", true, now)})
	k := clusterset.Key{Namespace: "ns", Name: "web"}
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "web", "10.0.0.2", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	step := func(what string, a, b string, deferred float64, writes ...string) {
		t.Helper()
		e.step(what, "web", map[string][]string{"a": {a}, "b": {b}}, writes...)
		if v := testutil.ToFloat64(e.metrics.Deferred); v != deferred {
			t.Errorf("%s: deferred %v, want %v", what, v, deferred)
		}
	}
	// The first sync paced the service and both shares; the service's and
	// b's waits have passed, a's has not.
	delete(e.ctl.notBefore, k)
	delete(e.ctl.shareNotBefore, shareKey{k, "b"})
	e.table.Upsert(exporter("a", "web", "10.0.0.11", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "web", "10.0.0.12", annotation.TypeClusterSetIP))
	step("a and b changed", "10.0.0.1", "10.0.0.12", 1, "patch endpointslices ")
	if _, ok := e.ctl.notBefore[k]; ok {
		t.Errorf("a slice's write paced the whole service")
	}

	// a keeps changing; b changes once its own wait has passed.
	for i := range 3 {
		e.table.Upsert(exporter("a", "web", fmt.Sprintf("10.0.1.%d", i), annotation.TypeClusterSetIP))
		delete(e.ctl.shareNotBefore, shareKey{k, "b"})
		e.table.Upsert(exporter("b", "web", fmt.Sprintf("10.0.2.%d", i), annotation.TypeClusterSetIP))
		step(fmt.Sprintf("a flapping, b changed (%d)", i), "10.0.0.1", fmt.Sprintf("10.0.2.%d", i), float64(2+i), "patch endpointslices ")
	}

	// a's due: its share is written as it is now.
	e.ctl.shareNotBefore[shareKey{k, "a"}] = time.Now().Add(-time.Second)
	e.ctl.queue.Add(k)
	step("a due", "10.0.1.2", "10.0.2.2", 4, "patch endpointslices ")

	// A change of the ServiceImport (a port), once the service is due,
	// takes every share with it, a's too, though a's own wait has not
	// passed: the slices' ports follow the import's.
	port := func(cl, ip string) *store.Pod {
		p := exporter(cl, "web", ip, annotation.TypeClusterSetIP)
		p.Exports[0].Ports[0].Port = 81
		return p
	}
	delete(e.ctl.notBefore, k)
	e.table.Upsert(port("a", "10.0.3.1"))
	e.table.Upsert(port("b", "10.0.3.2"))
	before := e.mark()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range e.writesSince(before) {
		if w == "patch endpointslices " {
			n++
		}
	}
	if n != 2 {
		t.Errorf("port changed: %d slice writes, want 2 (%q)", n, e.writesSince(before))
	}
	want := map[string][]string{"a": {"10.0.3.1"}, "b": {"10.0.3.2"}}
	if got := e.slicesBy("web"); !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("port changed: slices %v, want %v", got, want)
	}
}

// The wait after a write: Damp for a few writes in a row, then twice as
// long for each write within twice the wait, up to DampMax; Damp again
// after a quiet time.
func TestDampingInterval(t *testing.T) {
	c := New(store.New(), nil, nil, nil, nil, Config{LocalCluster: "a", Damp: time.Second, DampMax: 10 * time.Second}, NewMetrics(nil))
	defer c.queue.ShutDown()
	k := clusterset.Key{Namespace: "ns", Name: "web"}
	now := time.Unix(1000, 0)
	var waits []time.Duration
	for range 8 {
		next := c.wrote(k, now)
		waits = append(waits, next.Sub(now))
		now = next
	}
	want := []time.Duration{1, 1, 1, 1, 2, 4, 8, 10}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	if next := c.wrote(k, now.Add(time.Minute)); next.Sub(now.Add(time.Minute)) != time.Second {
		t.Errorf("after a quiet minute the wait is %v, want 1s", next.Sub(now.Add(time.Minute)))
	}
}

// With a recorder, a conflict between the clusters' exports is recorded as
// a Warning Event on the local ServiceExport and on the ServiceImport, once
// on each while it lasts.
func TestConflictEvent(t *testing.T) {
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": exportsGVR.GroupVersion().String(), "kind": "ServiceExport",
		"metadata": map[string]any{"namespace": "ns", "name": "web"},
	}}
	rec := record.NewFakeRecorder(10)
	rec.IncludeObject = true
	e := newEnv(t, Config{Recorder: rec}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, se)
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeHeadless))
	e.table.Upsert(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()
	for range 2 {
		if err := e.reconcile(); err != nil {
			t.Fatal(err)
		}
		e.poll("the export informer to see the condition", func() bool {
			o, err := e.ctl.exports.ByNamespace("ns").Get("web")
			return err == nil && condition(o.(*unstructured.Unstructured), "Conflict") != nil
		})
	}
	close(rec.Events)
	var got []string
	for ev := range rec.Events {
		got = append(got, ev)
	}
	slices.Sort(got)
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning "+ReasonConflict+" TypeConflict") || !strings.Contains(got[0], "kind=ServiceExport") ||
		!strings.HasPrefix(got[1], "Warning "+ReasonConflict+" TypeConflict") || !strings.Contains(got[1], "kind=ServiceImport") {
		t.Errorf("events %q, want one TypeConflict warning on the ServiceExport, one on the ServiceImport", got)
	}
}
