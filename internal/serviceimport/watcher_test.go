package serviceimport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/table"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

func serviceImport(version, ns, name, typ string, ips []any, ports ...any) *unstructured.Unstructured {
	spec := map[string]any{"type": typ}
	if ips != nil {
		spec["ips"] = ips
	}
	if ports != nil {
		spec["ports"] = ports
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(mcsapi.Group + "/" + version)
	u.SetKind("ServiceImport")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetResourceVersion("1")
	return u
}

func httpPort() map[string]any {
	return map[string]any{"name": "http", "port": int64(80), "protocol": "TCP"}
}

func TestFromUnstructured(t *testing.T) {
	for _, c := range []struct {
		name    string
		u       *unstructured.Unstructured
		ips     []string // of the ClusterSetIP; nil: none
		ports   int
		reasons []Reason
	}{
		{"clustersetip", serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"10.96.0.1", "fd00::1"}, httpPort()),
			[]string{"10.96.0.1", "fd00::1"}, 1, nil},
		{"v1alpha1", serviceImport("v1alpha1", "default", "a", "ClusterSetIP", []any{"10.96.0.1"}), []string{"10.96.0.1"}, 0, nil},
		{"headless", serviceImport("v1beta1", "default", "a", "Headless", nil, httpPort()), nil, 0, nil},
		{"no ips yet", serviceImport("v1beta1", "default", "a", "ClusterSetIP", nil, httpPort()), nil, 0, nil},
		{"a bad ip among good", serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"10.96.0.300", "10.96.0.1", int64(5)}),
			[]string{"10.96.0.1"}, 0, []Reason{ReasonInvalidIP, ReasonInvalidIP}},
		{"only bad ips", serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"nope", "0.0.0.0", "fe80::1%eth0"}),
			nil, 0, []Reason{ReasonInvalidIP, ReasonInvalidIP, ReasonInvalidIP}},
		{"wrong type", serviceImport("v1beta1", "default", "a", "LoadBalancer", []any{"10.96.0.1"}), nil, 0, []Reason{ReasonInvalidType}},
		{"ips not a list", serviceImport("v1beta1", "default", "a", "ClusterSetIP", nil), nil, 0, nil},
		{"bad ports", serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"10.96.0.1"},
			map[string]any{"name": "a", "port": int64(0)}, map[string]any{"name": "b", "port": int64(1), "protocol": "ICMP"},
			map[string]any{"name": "Bad_Name", "port": int64(1)}, "x", map[string]any{"port": int64(53), "protocol": "UDP"}),
			[]string{"10.96.0.1"}, 1, []Reason{ReasonInvalidPort, ReasonInvalidPort, ReasonInvalidPort, ReasonInvalidPort}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "ips not a list" {
				c.u.Object["spec"].(map[string]any)["ips"] = "10.96.0.1"
				c.reasons = []Reason{ReasonMalformed}
			}
			s := FromUnstructured(c.u)
			var reasons []Reason
			for _, r := range s.Rejected {
				reasons = append(reasons, r.Reason)
			}
			if !slices.Equal(reasons, c.reasons) {
				t.Errorf("rejections %v, want %v", s.Rejected, c.reasons)
			}
			if c.ips == nil {
				if s.ClusterSetIP != nil {
					t.Errorf("counted as a ClusterSetIP service: %+v", s.ClusterSetIP)
				}
				return
			}
			if s.ClusterSetIP == nil {
				t.Fatal("not counted as a ClusterSetIP service")
			}
			var got []string
			for _, ip := range s.ClusterSetIP.IPs {
				got = append(got, ip.String())
			}
			if !slices.Equal(got, c.ips) || len(s.ClusterSetIP.Ports) != c.ports {
				t.Errorf("got %v ports %v, want %v and %d ports", got, s.ClusterSetIP.Ports, c.ips, c.ports)
			}
		})
	}
}

// disco is a discovery client whose answer the test changes.
type disco struct {
	*fakediscovery.FakeDiscovery
	mu      sync.Mutex
	version string // served version; "" none
	down    bool
}

func (d *disco) set(version string, down bool) {
	d.mu.Lock()
	d.version, d.down = version, down
	d.mu.Unlock()
}

func (d *disco) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return nil, errors.New("connect: connection refused")
	}
	if d.version != "" && gv == mcsapi.Group+"/"+d.version {
		return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: mcsapi.ServiceImports, Namespaced: true, Kind: "ServiceImport"}}}, nil
	}
	return (&fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}).ServerResourcesForGroupVersion(gv)
}

// recorder collects what the watcher hands over.
type recorder struct {
	mu       sync.Mutex
	sets     [][]table.ClusterSetIP
	rejected []string
	absent   int
}

func (r *recorder) events() Events {
	return Events{
		Changed: func(l []table.ClusterSetIP) { r.mu.Lock(); r.sets = append(r.sets, l); r.mu.Unlock() },
		Rejected: func(ns, name string, rej []Rejection) {
			r.mu.Lock()
			r.rejected = append(r.rejected, fmt.Sprintf("%s/%s %s", ns, name, rej[0].Reason))
			r.mu.Unlock()
		},
		Absent: func() { r.mu.Lock(); r.absent++; r.mu.Unlock() },
	}
}

// last is the last set handed over, as "ns/name=ip,ip" strings; ok is false
// when none was.
func (r *recorder) last() (got []string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sets) == 0 {
		return nil, false
	}
	for _, ci := range r.sets[len(r.sets)-1] {
		var ips []string
		for _, ip := range ci.IPs {
			ips = append(ips, ip.String())
		}
		got = append(got, ci.Namespace+"/"+ci.Name+"="+strings.Join(ips, ","))
	}
	return got, true
}

func (r *recorder) waitFor(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, ok := r.last()
		if ok && slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("last set %q (handed over: %v), want %q", got, ok, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func fakeDynamic(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	lists := map[schema.GroupVersionResource]string{}
	for _, v := range mcsapi.Versions {
		lists[schema.GroupVersionResource{Group: mcsapi.Group, Version: v, Resource: mcsapi.ServiceImports}] = "ServiceImportList"
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists, objs...)
}

// The CRD absent: nothing (and a clear) once; installed later: picked up at
// the next check; then every change, deletion included, is handed over.
func TestWatcher(t *testing.T) {
	d := &disco{FakeDiscovery: &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}}
	gvr := schema.GroupVersionResource{Group: mcsapi.Group, Version: "v1beta1", Resource: mcsapi.ServiceImports}
	dyn := fakeDynamic(serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"10.96.0.1"}, httpPort()),
		serviceImport("v1beta1", "default", "h", "Headless", nil),
		serviceImport("v1beta1", "web", "bad", "ClusterSetIP", []any{"nope"}))
	var rec recorder
	w := New(d, dyn, rec.events(), Options{Recheck: 50 * time.Millisecond})
	w.Start()
	defer w.Stop()

	rec.waitFor(t) // absent: an empty set
	time.Sleep(200 * time.Millisecond)
	rec.mu.Lock()
	absent, sets := rec.absent, len(rec.sets)
	rec.mu.Unlock()
	if absent != 1 || sets != 1 {
		t.Fatalf("CRD absent: %d Absent and %d sets after several checks, want 1 each", absent, sets)
	}

	d.set("v1beta1", false)
	rec.waitFor(t, "default/a=10.96.0.1")
	rec.mu.Lock()
	if !slices.Equal(rec.rejected, []string{"web/bad invalid_ip"}) {
		t.Errorf("rejected %q", rec.rejected)
	}
	rec.mu.Unlock()

	ctx := context.Background()
	b := serviceImport("v1beta1", "web", "b", "ClusterSetIP", []any{"fd00::2", "10.96.0.2"})
	if _, err := dyn.Resource(gvr).Namespace("web").Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "default/a=10.96.0.1", "web/b=fd00::2,10.96.0.2")
	a := serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"10.96.0.9"})
	a.SetResourceVersion("2")
	if _, err := dyn.Resource(gvr).Namespace("default").Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "default/a=10.96.0.9", "web/b=fd00::2,10.96.0.2")
	if err := dyn.Resource(gvr).Namespace("default").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "web/b=fd00::2,10.96.0.2")

	// The API server stops answering discovery: what is held stays.
	d.set("v1beta1", true)
	time.Sleep(200 * time.Millisecond)
	rec.waitFor(t, "web/b=fd00::2,10.96.0.2")
	// The CRD removed: the set empties.
	d.set("", false)
	rec.waitFor(t)
}

// A run's store hands nothing over before the first complete list, then the
// set after each change; a delete hands over the set without the object, an
// update at the same version nothing, a closed store nothing more.
func TestRunStore(t *testing.T) {
	var rec recorder
	w := New(nil, nil, rec.events(), Options{})
	st := w.newRun(schema.GroupVersionResource{}).store
	a := FromUnstructured(serviceImport("v1beta1", "default", "a", "ClusterSetIP", []any{"10.96.0.1"}))
	b := FromUnstructured(serviceImport("v1beta1", "default", "b", "ClusterSetIP", []any{"10.96.0.2"}))
	if err := st.Add(a); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.last(); ok {
		t.Fatal("handed over before the first list was in")
	}
	if err := st.Replace([]any{a}, "5"); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "default/a=10.96.0.1")
	if err := st.Add(b); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "default/a=10.96.0.1", "default/b=10.96.0.2")
	if err := st.Delete(a); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "default/b=10.96.0.2")
	n := len(rec.sets)
	if err := st.Update(b); err != nil {
		t.Fatal(err)
	}
	if len(rec.sets) != n {
		t.Error("an unchanged version was handed over")
	}
	st.Close()
	if err := st.Delete(b); err != nil {
		t.Fatal(err)
	}
	if len(rec.sets) != n {
		t.Error("a closed store handed over")
	}
	if rec.rejected != nil {
		t.Errorf("rejected %q", rec.rejected)
	}
}

// hungDisco never answers until released.
type hungDisco struct {
	*fakediscovery.FakeDiscovery
	release chan struct{}
}

func (d *hungDisco) ServerResourcesForGroupVersion(string) (*metav1.APIResourceList, error) {
	<-d.release
	return nil, errors.New("gave up")
}

// Stop does not wait for a discovery request to a hung API server.
func TestStopWithHungDiscovery(t *testing.T) {
	d := &hungDisco{FakeDiscovery: &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}, release: make(chan struct{})}
	defer close(d.release)
	var rec recorder
	w := New(d, fakeDynamic(), rec.events(), Options{Ingest: ingest.Options{StopWait: 100 * time.Millisecond}})
	w.Start()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	err := w.Stop()
	if took := time.Since(start); took > time.Second {
		t.Errorf("Stop took %s", took)
	}
	if !errors.Is(err, ingest.ErrSlow) {
		t.Errorf("Stop: %v, want ErrSlow", err)
	}
	if _, ok := rec.last(); ok {
		t.Error("handed something over")
	}
}

// Events that change no ClusterSetIP (a headless import created or updated,
// a ClusterSetIP import's status) hand nothing over: the table and the
// snapshot would rebuild and rewrite for nothing. A run's first set always
// goes through, empty or not: it replaces what the snapshot seeded.
func TestUnchangedSetNotHandedOver(t *testing.T) {
	d := &disco{FakeDiscovery: &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}}
	d.set("v1beta1", false)
	gvr := schema.GroupVersionResource{Group: mcsapi.Group, Version: "v1beta1", Resource: mcsapi.ServiceImports}
	dyn := fakeDynamic(serviceImport("v1beta1", "default", "h", "Headless", nil))
	var rec recorder
	w := New(d, dyn, rec.events(), Options{Recheck: time.Hour})
	w.Start()
	defer w.Stop()
	rec.waitFor(t) // the first set, empty, is handed over
	count := func() int { rec.mu.Lock(); defer rec.mu.Unlock(); return len(rec.sets) }

	ctx := context.Background()
	h := serviceImport("v1beta1", "default", "h", "Headless", nil)
	h.SetResourceVersion("2")
	h.SetLabels(map[string]string{"changed": "yes"})
	if _, err := dyn.Resource(gvr).Namespace("default").Update(ctx, h, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, serviceImport("v1beta1", "default", "h2", "Headless", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A ClusterSetIP import after them: once it shows, the events before it
	// were all handled, in order.
	if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, serviceImport("v1beta1", "default", "v", "ClusterSetIP", []any{"10.96.0.7"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "default/v=10.96.0.7")
	if n := count(); n != 2 {
		t.Errorf("%d sets handed over, want 2 (the first, then the ClusterSetIP): the headless events handed over unchanged sets", n)
	}
}
