package mcscontroller

import (
	"context"
	"encoding/json"
	"fmt"
	"k8s.io/client-go/tools/cache"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

// The controller against fake clientsets: a typed one for namespaces,
// Services and EndpointSlices, a dynamic one for the MCS objects (its
// tracker does not apply to an object that does not exist, so a reactor
// stands in for server-side apply), and a discovery that serves the MCS
// group when told to.

var (
	importsGVR = schema.GroupVersionResource{Group: mcsapi.Group, Version: "v1beta1", Resource: mcsapi.ServiceImports}
	exportsGVR = schema.GroupVersionResource{Group: mcsapi.Group, Version: "v1beta1", Resource: mcsapi.ServiceExports}
)

// fakeSource is a cluster's feed as the controller sees it.
type fakeSource struct {
	cluster string
	synced  atomic.Bool
	last    atomic.Int64 // unix nanoseconds; 0: never answered
	cut     atomic.Bool  // not connected
	full    atomic.Int64 // last full list, unix nanoseconds; 0: never
}

func newSource(cluster string, synced bool, last time.Time) *fakeSource {
	s := &fakeSource{cluster: cluster}
	s.synced.Store(synced)
	s.setLast(last)
	return s
}

func (s *fakeSource) Cluster() string { return s.cluster }
func (s *fakeSource) HasSynced() bool { return s.synced.Load() }
func (s *fakeSource) Connected() bool { return !s.cut.Load() }
func (s *fakeSource) setLast(t time.Time) {
	if t.IsZero() {
		s.last.Store(0)
		return
	}
	s.last.Store(t.UnixNano())
}

func (s *fakeSource) LastContact() time.Time {
	if n := s.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// servedDiscovery serves the MCS group's v1beta1 once served is set.
type servedDiscovery struct {
	*fakediscovery.FakeDiscovery
	served atomic.Bool
}

func (d *servedDiscovery) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	if !d.served.Load() || gv != mcsapi.Group+"/v1beta1" {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: mcsapi.Group}, gv)
	}
	return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{
		{Name: mcsapi.ServiceImports, Namespaced: true, Kind: "ServiceImport"},
		{Name: mcsapi.ServiceExports, Namespaced: true, Kind: "ServiceExport"},
	}}, nil
}

type env struct {
	t       testing.TB
	table   *store.Store // the records the controller reads
	client  *fake.Clientset
	dyn     *dynamicfake.FakeDynamicClient
	disco   *servedDiscovery
	metrics *Metrics
	ctl     *Controller
	sources map[string]*fakeSource
	cancel  context.CancelFunc
	ctx     context.Context
	// stopLoop stops the write loop start(true) started (nil before).
	stopLoop func()
}

// newEnv makes the fakes holding objs (typed and unstructured) and a
// controller over sources; the namespace "ns" exists. Nothing runs yet.
func newEnv(t testing.TB, cfg Config, sources []*fakeSource, objs ...runtime.Object) *env {
	var typed, dynamic []runtime.Object
	typed = append(typed, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	for _, o := range objs {
		if _, ok := o.(*unstructured.Unstructured); ok {
			dynamic = append(dynamic, o)
		} else {
			typed = append(typed, o)
		}
	}
	e := &env{t: t, table: store.New(), client: fake.NewSimpleClientset(typed...),
		metrics: NewMetrics(nil), sources: map[string]*fakeSource{}}
	e.client.PrependReactor("patch", "*", typedApplyReactor(e.client.Tracker()))
	e.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{importsGVR: "ServiceImportList", exportsGVR: "ServiceExportList"}, dynamic...)
	e.dyn.PrependReactor("patch", "*", applyReactor(e.dyn.Tracker()))
	e.disco = &servedDiscovery{FakeDiscovery: &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}}
	e.disco.served.Store(true)
	var srcs []Source
	for _, s := range sources {
		e.sources[s.cluster] = s
		srcs = append(srcs, s)
	}
	if cfg.LocalCluster == "" {
		cfg.LocalCluster = "a"
	}
	if cfg.CRDPoll == 0 {
		cfg.CRDPoll = 10 * time.Millisecond
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Millisecond
	}
	if cfg.Damp == 0 {
		cfg.Damp = -1 // the tests of damping ask for it
	}
	if cfg.LocalCluster == "" {
		cfg.LocalCluster = "a"
	}
	e.ctl = New(e.table, srcs, e.client, e.dyn, e.disco, cfg, e.metrics)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	t.Cleanup(e.cancel)
	return e
}

// applyReactor stands in for server-side apply with Force in the dynamic
// fake: the applied labels, annotations and spec (or status) replace the
// stored ones; an object that does not exist is created.
func applyReactor(tr clienttesting.ObjectTracker) clienttesting.ReactionFunc {
	return func(a clienttesting.Action) (bool, runtime.Object, error) {
		pa, ok := a.(clienttesting.PatchAction)
		if !ok || pa.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		patch := &unstructured.Unstructured{}
		if err := json.Unmarshal(pa.GetPatch(), &patch.Object); err != nil {
			return true, nil, err
		}
		gvr, ns, name := pa.GetResource(), pa.GetNamespace(), pa.GetName()
		o, err := tr.Get(gvr, ns, name)
		if apierrors.IsNotFound(err) && pa.GetSubresource() == "" {
			patch.SetUID(types.UID("uid-" + ns + "-" + name))
			return true, patch, tr.Create(gvr, patch, ns)
		}
		if err != nil {
			return true, nil, err
		}
		cur := o.(*unstructured.Unstructured).DeepCopy()
		if pa.GetSubresource() == "status" {
			cur.Object["status"] = patch.Object["status"]
		} else {
			cur.SetLabels(patch.GetLabels())
			cur.SetAnnotations(patch.GetAnnotations())
			cur.Object["spec"] = patch.Object["spec"]
		}
		return true, cur, tr.Update(gvr, cur, ns)
	}
}

// typedApplyReactor stands in for server-side apply with Force of the
// derived Services and the EndpointSlices: the applied object replaces the
// stored one, which keeps its UID and allocated ClusterIPs. (The fake's own
// field-managed apply builds a REST mapper for every call: too slow for the
// benchmark's tens of thousands.)
func typedApplyReactor(tr clienttesting.ObjectTracker) clienttesting.ReactionFunc {
	var allocated atomic.Int32
	var version atomic.Int64 // each write's resourceVersion, as an API server sets it
	return func(a clienttesting.Action) (bool, runtime.Object, error) {
		pa, ok := a.(clienttesting.PatchAction)
		if !ok || pa.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		gvr, ns, name := pa.GetResource(), pa.GetNamespace(), pa.GetName()
		var obj runtime.Object
		switch gvr.Resource {
		case "services":
			obj = &corev1.Service{}
		case "endpointslices":
			obj = &discoveryv1.EndpointSlice{}
		case "leases":
			obj = &coordinationv1.Lease{}
		default:
			return false, nil, nil
		}
		if err := json.Unmarshal(pa.GetPatch(), obj); err != nil {
			return true, nil, err
		}
		m := obj.(metav1.Object)
		m.SetNamespace(ns)
		m.SetResourceVersion(strconv.FormatInt(version.Add(1), 10))
		cur, err := tr.Get(gvr, ns, name)
		if apierrors.IsNotFound(err) {
			m.SetUID(types.UID("uid-" + ns + "-" + name))
			if svc, ok := obj.(*corev1.Service); ok {
				n := allocated.Add(1)
				svc.Spec.ClusterIP = netip.AddrFrom4([4]byte{10, 96, byte(n >> 8), byte(n)}).String()
				svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
				svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
			}
			return true, obj, tr.Create(gvr, obj, ns)
		}
		if err != nil {
			return true, nil, err
		}
		m.SetUID(cur.(metav1.Object).GetUID())
		if svc, ok := obj.(*corev1.Service); ok {
			old := cur.(*corev1.Service)
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs, svc.Spec.IPFamilies = old.Spec.ClusterIP, old.Spec.ClusterIPs, old.Spec.IPFamilies
		}
		return true, obj, tr.Update(gvr, obj, ns)
	}
}

// start runs the controller's informers (Run), and its write loop when loop is set.
func (e *env) start(loop bool) {
	go e.ctl.Run(e.ctx)
	if !loop {
		return
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.ctl.RunLoop(ctx)
	}()
	// A test that calls Reconcile itself stops the loop first: Reconcile
	// takes the queue's keys while Len says there are some, and a loop
	// taking them at the same time leaves it waiting in Get for the next.
	//
	// stopLoop queues a key to wake a loop waiting in Get (it then sees
	// ctx done and returns), again until the loop has returned: a
	// reconcile under way may take the key with the rest of the queue.
	e.stopLoop = func() {
		e.t.Helper()
		cancel()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		limit := time.After(10 * time.Second)
		for {
			e.ctl.queue.Add(keyRecords)
			select {
			case <-done:
				return
			case <-limit:
				e.t.Fatal("the write loop did not stop")
			case <-tick.C:
			}
		}
	}
}

// waitSynced waits until the CRDs are known and every informer has synced.
func (e *env) waitSynced() {
	e.t.Helper()
	e.poll("the informers to sync", func() bool {
		select {
		case <-e.ctl.ready:
		default:
			return false
		}
		for _, s := range e.ctl.synced {
			if !s() {
				return false
			}
		}
		return true
	})
}

func (e *env) poll(what string, ok func() bool) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return ok(), nil
	})
	if err != nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// reconcile runs one reconcile and waits until the informers hold what it wrote.
func (e *env) reconcile() error {
	e.t.Helper()
	err := e.ctl.Reconcile(e.ctx)
	e.poll("the informers to see the writes", e.caughtUp)
	return err
}

// caughtUp reports whether the informers hold every object the fakes hold,
// each as last written: the same number, and each with the same
// annotations (an object written twice, as a ServiceImport before and after
// its derived Service has IPs, is counted once after its first write).
func (e *env) caughtUp() bool {
	imports, _ := e.ctl.imports.List(labels.Everything())
	if len(e.ctl.slices.List()) != len(e.slices()) || len(e.ctl.services.List()) != len(e.derivedServices()) ||
		len(imports) != len(e.serviceImports()) {
		return false
	}
	same := func(ix cache.Indexer, key string, stored map[string]string) bool {
		o, ok, _ := ix.GetByKey(key)
		m, err := meta.Accessor(o)
		return ok && err == nil && maps.Equal(m.GetAnnotations(), stored)
	}
	for _, s := range e.slices() {
		if !same(e.ctl.slices, s.Namespace+"/"+s.Name, s.Annotations) {
			return false
		}
	}
	for _, s := range e.derivedServices() {
		if !same(e.ctl.services, s.Namespace+"/"+s.Name, s.Annotations) {
			return false
		}
	}
	for _, o := range e.serviceImports() {
		m, err := meta.Accessor(o)
		if err != nil {
			return false
		}
		held, err := e.ctl.imports.ByNamespace(m.GetNamespace()).Get(m.GetName())
		if err != nil {
			return false
		}
		hm, err := meta.Accessor(held)
		if err != nil || !maps.Equal(hm.GetAnnotations(), m.GetAnnotations()) {
			return false
		}
	}
	return true
}

// writes are the write requests the fakes received (failed ones included).
func (e *env) writes() []string { return e.writesSince(mark{}) }

// mark is how many requests each fake had received.
type mark struct{ typed, dynamic int }

func (e *env) mark() mark { return mark{len(e.client.Actions()), len(e.dyn.Actions())} }

// writesSince are the write requests received after m.
func (e *env) writesSince(m mark) []string {
	var out []string
	for _, list := range [][]clienttesting.Action{e.client.Actions()[m.typed:], e.dyn.Actions()[m.dynamic:]} {
		for _, a := range list {
			switch a.GetVerb() {
			case "create", "update", "patch", "delete", "deletecollection":
				out = append(out, fmt.Sprintf("%s %s %s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource()))
			}
		}
	}
	return out
}

func (e *env) slices() []discoveryv1.EndpointSlice {
	e.t.Helper()
	l, err := e.client.Tracker().List(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"),
		discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), "ns")
	if err != nil {
		e.t.Fatal(err)
	}
	return l.(*discoveryv1.EndpointSliceList).Items
}

func (e *env) derivedServices() []corev1.Service {
	e.t.Helper()
	l, err := e.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service"), "ns")
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Service
	for _, s := range l.(*corev1.ServiceList).Items {
		if s.Labels[clusterset.LabelManagedBy] == clusterset.ManagedBy {
			out = append(out, s)
		}
	}
	return out
}

// step reconciles and checks the writes it made (each "verb resource
// subresource") and the addresses of service's slices by cluster.
func (e *env) step(what, service string, want map[string][]string, writes ...string) {
	e.t.Helper()
	before := e.mark()
	if err := e.reconcile(); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	if got := e.writesSince(before); !slices.Equal(got, writes) {
		e.t.Errorf("%s: writes %q, want %q", what, got, writes)
	}
	if got := e.slicesBy(service); !maps.EqualFunc(got, want, slices.Equal) {
		e.t.Errorf("%s: slices %v, want %v", what, got, want)
	}
}

// slicesBy returns the endpoint addresses of service name's slices by source cluster.
func (e *env) slicesBy(name string) map[string][]string {
	out := map[string][]string{}
	for _, s := range e.slices() {
		if s.Labels["multicluster.kubernetes.io/service-name"] != name {
			continue
		}
		cl := s.Labels["multicluster.kubernetes.io/source-cluster"]
		for _, ep := range s.Endpoints {
			out[cl] = append(out[cl], ep.Addresses...)
		}
	}
	return out
}

// serviceImports are the stored ServiceImports of every namespace.
func (e *env) serviceImports() []runtime.Object {
	e.t.Helper()
	l, err := e.dyn.Tracker().List(importsGVR, importsGVR.GroupVersion().WithKind("ServiceImport"), "")
	if err != nil {
		e.t.Fatal(err)
	}
	items, err := meta.ExtractList(l)
	if err != nil {
		e.t.Fatal(err)
	}
	return items
}

// serviceImport returns the stored ServiceImport ns/name (nil: none).
func (e *env) serviceImport(name string) *unstructured.Unstructured {
	e.t.Helper()
	o, err := e.dyn.Tracker().Get(importsGVR, "ns", name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return o.(*unstructured.Unstructured)
}

// importClusters returns the clusters in a ServiceImport's status.
func importClusters(u *unstructured.Unstructured) []string {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "clusters")
	var out []string
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			out = append(out, fmt.Sprint(m["cluster"]))
		}
	}
	return out
}

// exporter is a Pod of cluster exporting service name (ClusterSetIP, port http 80 -> 8080).
func exporter(cluster, name, ip string, typ string) *store.Pod {
	e := annotation.Export{Name: name, Namespace: "ns", Cluster: cluster,
		Ports:   []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}},
		Service: annotation.Service{Type: typ}}
	return &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: "ns", Exports: []annotation.Export{e}},
		Name: name + "-" + cluster, IPs: []netip.Addr{netip.MustParseAddr(ip)}, Ready: true}
}

// errUnreachable is what every request of an unreachable API server gets.
var errUnreachable = fmt.Errorf("dial tcp 127.0.0.1:6443: %w", syscall.ECONNREFUSED)

// unreachable makes every request of the fake fail while down is set.
func unreachable(f *clienttesting.Fake, down *atomic.Bool) {
	f.PrependReactor("*", "*", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errUnreachable
		}
		return false, nil, nil
	})
	f.PrependWatchReactor("*", func(clienttesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, errUnreachable
		}
		return false, nil, nil
	})
}
