package mcscontroller

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// A ServiceImport that another MCS implementation made (without our
// managed-by label) is neither written nor deleted, and nothing is derived
// from it; the other services are imported as usual.
func TestForeignServiceImportLeftAlone(t *testing.T) {
	foreign := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": importsGVR.GroupVersion().String(), "kind": "ServiceImport",
		"metadata": map[string]any{"namespace": "ns", "name": "web", "uid": "theirs",
			"labels": map[string]any{"app.kubernetes.io/managed-by": "other-mcs"}},
		"spec":   map[string]any{"type": "ClusterSetIP", "ips": []any{"10.96.9.9"}, "ports": []any{map[string]any{"port": int64(443), "protocol": "TCP"}}},
		"status": map[string]any{"clusters": []any{map[string]any{"cluster": "elsewhere"}}},
	}}
	want := foreign.DeepCopy()
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())}, foreign)
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("a", "api", "10.0.0.2", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()

	err := e.reconcile()
	if err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Errorf("reconcile: %v, want the foreign ServiceImport named", err)
	}
	for _, w := range e.dyn.Actions() {
		if p, ok := w.(clienttesting.PatchAction); ok && p.GetName() == "web" {
			t.Errorf("the foreign ServiceImport was written: %s %s", w.GetVerb(), w.GetSubresource())
		}
		if d, ok := w.(clienttesting.DeleteAction); ok && d.GetName() == "web" {
			t.Errorf("the foreign ServiceImport was deleted")
		}
	}
	if got := e.serviceImport("web"); got == nil || !equalObjects(got, want) {
		t.Errorf("the foreign ServiceImport changed: %v", got)
	}
	if by := e.slicesBy("web"); len(by) > 0 {
		t.Errorf("slices were written for the foreign import: %v", by)
	}
	for _, s := range e.derivedServices() {
		if s.Name == clusterset.DerivedServiceName("web") {
			t.Errorf("a derived Service was made for the foreign import")
		}
	}
	if got := testutil.ToFloat64(e.metrics.Foreign); got != 1 {
		t.Errorf("mcs_controller_foreign_objects_total %v, want 1", got)
	}
	if e.serviceImport("api") == nil || len(e.slicesBy("api")["a"]) != 1 {
		t.Errorf("api was not imported beside it")
	}
}

func equalObjects(a, b *unstructured.Unstructured) bool {
	ja, _ := json.Marshal(map[string]any{"l": a.GetLabels(), "a": a.GetAnnotations(), "s": a.Object["spec"], "st": a.Object["status"]})
	jb, _ := json.Marshal(map[string]any{"l": b.GetLabels(), "a": b.GetAnnotations(), "s": b.Object["spec"], "st": b.Object["status"]})
	return string(ja) == string(jb)
}

// Nothing is written before the ServiceImport CRD's version is known and
// every informer has synced: until then the controller cannot tell what
// exists, and would write over (or beside) what it cannot see.
func TestNoWritesBeforeCRDAndInformers(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())})
	e.disco.served.Store(false)
	var slicesDown atomic.Bool
	var failedLists atomic.Int32
	slicesDown.Store(true)
	e.client.PrependReactor("list", "endpointslices", func(clienttesting.Action) (bool, runtime.Object, error) {
		if slicesDown.Load() {
			failedLists.Add(1)
			return true, nil, errUnreachable
		}
		return false, nil, nil
	})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.start(true)

	// The CRD is not served: no version, no writes.
	e.poll("the slice informer to fail a list", func() bool { return failedLists.Load() >= 1 })
	if err := e.ctl.Reconcile(e.ctx); err != nil {
		t.Errorf("reconcile before the CRD is served: %v", err)
	}
	e.ctl.queue.Add(keyRecords)
	if w := e.writes(); len(w) > 0 {
		t.Fatalf("writes before the CRD is served: %v", w)
	}

	// The CRD is served; the EndpointSlice informer has not synced yet.
	e.disco.served.Store(true)
	e.poll("the CRD to be found", func() bool {
		select {
		case <-e.ctl.ready:
			return true
		default:
			return false
		}
	})
	n := failedLists.Load()
	e.poll("another failed slice list", func() bool { return failedLists.Load() > n })
	if err := e.ctl.Reconcile(e.ctx); err != nil {
		t.Errorf("reconcile before the informers synced: %v", err)
	}
	if w := e.writes(); len(w) > 0 {
		t.Fatalf("writes before the informers synced: %v", w)
	}

	// Everything synced: the loop writes.
	slicesDown.Store(false)
	e.poll("the ServiceImport and the slice", func() bool {
		return e.serviceImport("web") != nil && len(e.slicesBy("web")["a"]) == 1
	})
}

// With the local API server unreachable the controller writes nothing
// (not even a failing request) and deletes nothing: at start, with nothing
// synced, and later, past the peers' expiry (which is not the local
// cluster's). When it answers again, what a peer that has not answered yet
// exported is still there, and so is the local cluster's share.
func TestLocalAPIServerUnreachable(t *testing.T) {
	now := time.Now()
	a := newSource("a", true, now)
	b := newSource("b", false, time.Time{}) // not answered since the start
	entry := annotation.Export{Name: "web", Namespace: "ns", Cluster: "b",
		Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}, Service: annotation.Service{Type: annotation.TypeClusterSetIP}}
	raw, _ := json.Marshal(entry)
	bSlice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-b-0", Labels: clusterset.SliceLabels(clusterset.Key{Namespace: "ns", Name: "web"}, "b", ""),
			Annotations: map[string]string{AnnotationExport: string(raw)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.1.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	gone := &discoveryv1.EndpointSlice{ // of a cluster no longer configured: a connected controller deletes it
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-z-0", Labels: clusterset.SliceLabels(clusterset.Key{Namespace: "ns", Name: "web"}, "z", "")},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	// b never lists here: the loop's first reconcile does not wait for it.
	e := newEnv(t, Config{Expire: time.Minute, FirstLists: time.Millisecond}, []*fakeSource{a, b}, bSlice, gone)
	var down atomic.Bool
	down.Store(true)
	unreachable(&e.client.Fake, &down)
	unreachable(&e.dyn.Fake, &down)
	var failed atomic.Int32
	e.client.PrependReactor("list", "*", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			failed.Add(1)
		}
		return false, nil, nil
	})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.start(true)
	noWrites := func(when string, before mark) {
		t.Helper()
		if w := e.writesSince(before); len(w) > 0 {
			t.Fatalf("%s: requests to write while the API server is unreachable: %v", when, w)
		}
		for _, k := range writeKinds {
			if v := testutil.ToFloat64(e.metrics.Writes.WithLabelValues(k, "error")); v > 0 {
				t.Errorf("%s: %v failed %s writes", when, v, k)
			}
		}
	}

	// Unreachable at start.
	e.poll("the informers to fail their lists", func() bool { return failed.Load() >= 6 })
	e.ctl.queue.Add(keyRecords)
	if err := e.ctl.Reconcile(e.ctx); err != nil {
		t.Errorf("reconcile while unreachable: %v", err)
	}
	noWrites("unreachable at start", mark{})

	// It answers: a's share is written, b's slice (its share not known:
	// b has not answered since the start) is left as it is and b stays
	// named in the import, the slice of a cluster no longer configured goes.
	down.Store(false)
	e.poll("the import of a", func() bool {
		im := e.serviceImport("web")
		return im != nil && slices.Equal(importClusters(im), []string{"a", "b"}) && len(e.slicesBy("web")["a"]) == 1 &&
			len(e.slicesBy("web")["z"]) == 0
	})
	if got := e.slicesBy("web")["b"]; !slices.Equal(got, []string{"10.0.1.1"}) {
		t.Errorf("b's share after the API server came back: %v", got)
	}

	// Unreachable again, for longer than the expiry: the local cluster's
	// source has not reached it either. The loop stops first, so that the
	// reconciles are the test's own; then the informers must hold what was
	// written (a lagging one would make the next reconcile read the API
	// server, or write again) and a full reconcile must write nothing.
	e.stopLoop()
	e.poll("a reconcile that finds everything written", func() bool {
		m := e.mark()
		if !e.caughtUp() {
			return false
		}
		e.ctl.queue.Add(keyAll)
		return e.ctl.Reconcile(e.ctx) == nil && len(e.writesSince(m)) == 0
	})
	down.Store(true)
	a.setLast(now.Add(-2 * time.Minute))
	before := e.mark()
	e.ctl.queue.Add(keyAll)
	if err := e.ctl.Reconcile(e.ctx); err != nil {
		t.Errorf("reconcile while unreachable: %v", err)
	}
	noWrites("unreachable past the expiry", before)

	// It answers again before the local source does: nothing of a's is lost.
	down.Store(false)
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if im := e.serviceImport("web"); im == nil || !slices.Equal(importClusters(im), []string{"a", "b"}) || len(e.slicesBy("web")["a"]) != 1 ||
		!slices.Equal(e.slicesBy("web")["b"], []string{"10.0.1.1"}) {
		t.Errorf("after the API server came back: import %v, slices %v", im, e.slicesBy("web"))
	}
}

// A peer cut off keeps its share while it is within --peer-expire, whether
// the table still holds its records or only its slices do (the controller
// restarted while it is cut); past the expiry its share goes.
func TestPeerExpiry(t *testing.T) {
	now := time.Now()
	a, b := newSource("a", true, now), newSource("b", true, now)
	e := newEnv(t, Config{Expire: time.Minute}, []*fakeSource{a, b})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "db", "10.0.1.2", annotation.TypeHeadless))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	check := func(when string, webClusters []string, db bool) {
		t.Helper()
		im := e.serviceImport("web")
		if im == nil || !slices.Equal(importClusters(im), webClusters) {
			t.Errorf("%s: web's ServiceImport %v, want clusters %v", when, im, webClusters)
		}
		if got, want := len(e.slicesBy("web")["b"]) > 0, slices.Contains(webClusters, "b"); got != want {
			t.Errorf("%s: web has b's slices: %v, want %v", when, got, want)
		}
		if got := e.serviceImport("db") != nil && len(e.slicesBy("db")["b"]) == 1; got != db {
			t.Errorf("%s: db's import and slice present: %v, want %v", when, got, db)
		}
	}
	check("connected", []string{"a", "b"}, true)

	// Cut: the source keeps b's records; within the expiry nothing changes.
	b.setLast(now.Add(-50 * time.Second))
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	check("cut, within the expiry", []string{"a", "b"}, true)

	// The controller restarted while b is cut: b's share is only in its slices.
	b.synced.Store(false)
	e.table.ReplaceCluster("b", nil)
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	check("restarted, cut, within the expiry", []string{"a", "b"}, true)
	for _, w := range e.writes() {
		if strings.HasPrefix(w, "delete") {
			t.Errorf("within the expiry: %s", w)
		}
	}

	// Past the expiry b's share goes: its slices, its place in web's import, db's import.
	b.setLast(now.Add(-61 * time.Second))
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	check("past the expiry", []string{"a"}, false)
}

// An ExternalName Service exported by annotation (a hand-written entry or an
// old annotator) is refused where the entry is read, with a reason; no
// import comes of it, while the other entry of the same Pod is imported.
func TestExternalNameExportRefused(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ext-0", Namespace: "ns", UID: types.UID("uid-ext-0"),
			Labels: map[string]string{annotation.ExporterLabel: "true"},
			Annotations: map[string]string{annotation.ExportAnnotation: `{"services":[` +
				`{"name":"ext","type":"ExternalName","ports":[{"name":"http","port":80,"protocol":"TCP"}]},` +
				`{"name":"web","type":"ClusterSetIP","ports":[{"name":"http","port":80,"protocol":"TCP"}]}]}`}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.1.1", PodIPs: []corev1.PodIP{{IP: "10.0.1.1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	rec, rej := source.Record("b", nil, pod)
	if len(rej) != 1 || rej[0].Reason != annotation.ReasonService || rej[0].Index != 0 || !strings.Contains(rej[0].Detail, "ExternalName") {
		t.Errorf("rejections %v, want one %s naming ExternalName for entry 0", rej, annotation.ReasonService)
	}
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())})
	e.table.Upsert(rec)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if im := e.serviceImport("ext"); im != nil {
		t.Errorf("an import of the ExternalName export: %v", im.Object)
	}
	if by := e.slicesBy("ext"); len(by) > 0 {
		t.Errorf("slices of the ExternalName export: %v", by)
	}
	im := e.serviceImport("web")
	if im == nil || !slices.Equal(importClusters(im), []string{"b"}) {
		t.Errorf("the other entry's import: %v", im)
	}
	if typ, _, _ := unstructured.NestedString(im.Object, "spec", "type"); typ != string(mcsv1beta1.ClusterSetIP) {
		t.Errorf("web's type %q", typ)
	}
}

// A reconcile after a change writes what the change touched and nothing
// else: a Pod's readiness is one slice write; a Pod deleted or moved to
// another service removes what it alone was behind; an object of ours that
// someone else deleted is written again. A full reconcile afterwards finds
// nothing to write.
func TestReconcileWritesOnlyWhatChanged(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())})
	for i, n := range []string{"web", "db", "api"} {
		e.table.Upsert(exporter("a", n, fmt.Sprintf("10.0.0.%d", i+1), annotation.TypeClusterSetIP))
	}
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	step := func(what string, want ...string) {
		t.Helper()
		before := e.mark()
		if err := e.reconcile(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := e.writesSince(before)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: writes %q, want %q", what, got, want)
		}
	}
	step("nothing changed")

	web := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	web.Ready = false
	e.table.Upsert(web)
	step("web's Pod not ready", "patch endpointslices ")
	if s := e.slices(); len(s) != 3 {
		t.Fatalf("%d slices", len(s))
	}
	for _, s := range e.slices() {
		if s.Labels[mcsv1beta1.LabelServiceName] == "web" && *s.Endpoints[0].Conditions.Ready {
			t.Errorf("web's endpoint is still ready")
		}
	}

	e.table.Delete(exporter("a", "db", "10.0.0.2", annotation.TypeClusterSetIP).Key())
	step("db's Pod deleted", "delete endpointslices ", "delete services ", "delete serviceimports ")
	if e.serviceImport("db") != nil || len(e.slicesBy("db")) > 0 {
		t.Errorf("db's objects remain")
	}

	moved := exporter("a", "api", "10.0.0.3", annotation.TypeClusterSetIP)
	moved.Exports[0].Name = "api2"
	e.table.Upsert(moved)
	step("api's Pod now exports api2", "delete endpointslices ", "delete services ", "delete serviceimports ",
		"patch endpointslices ", "patch services ", "patch serviceimports ",
		"patch serviceimports ", "patch serviceimports status") // the second apply carries the derived Service's IPs, and the status
	if e.serviceImport("api") != nil || e.serviceImport("api2") == nil || len(e.slicesBy("api2")["a"]) != 1 {
		t.Errorf("api's objects were not moved to api2")
	}

	var webSlice string
	for _, s := range e.slices() {
		if s.Labels[mcsv1beta1.LabelServiceName] == "web" {
			webSlice = s.Name
		}
	}
	if err := e.client.Tracker().Delete(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), "ns", webSlice); err != nil {
		t.Fatal(err)
	}
	e.poll("the informer to see the delete", func() bool { return len(e.ctl.slices.List()) == 1 })
	step("web's slice deleted by someone else", "patch endpointslices ")

	e.ctl.queue.Add(keyAll)
	step("a full reconcile")
}

// A change to one cluster's share of a service builds and checks that
// cluster's slices only: the slices of a share whose records are the same
// are left as the last sync found them, as long as they still have the
// resourceVersion it found or wrote (a relay hub's service has a thousand
// origins' shares). Any change to such a slice (an API server gives it a
// new resourceVersion) has it checked, and written again.
func TestReconcileChecksOnlyChangedShares(t *testing.T) {
	now := time.Now()
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, now), newSource("b", true, now)})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "web", "10.0.0.2", annotation.TypeClusterSetIP))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	gvr := discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	// held waits for the informer to hold b's slice with addr (the edits
	// and writes here keep its annotations, which env.reconcile waits for).
	held := func(addr string) {
		t.Helper()
		e.poll("the informer to hold b's slice with "+addr, func() bool {
			for _, o := range e.ctl.slices.List() {
				if s := o.(*discoveryv1.EndpointSlice); s.Labels[mcsv1beta1.LabelSourceCluster] == "b" {
					return s.Endpoints[0].Addresses[0] == addr
				}
			}
			return false
		})
	}
	// edit sets b's slice's address in the fake API server, with rv as its
	// resourceVersion ("": the one it has).
	edit := func(addr, rv string) {
		t.Helper()
		for _, s := range e.slices() {
			if s.Labels[mcsv1beta1.LabelSourceCluster] != "b" {
				continue
			}
			s.Endpoints[0].Addresses = []string{addr}
			if rv != "" {
				s.ResourceVersion = rv
			}
			if err := e.client.Tracker().Update(gvr, &s, s.Namespace); err != nil {
				t.Fatal(err)
			}
		}
		held(addr)
	}
	step := func(what string, want map[string][]string, writes ...string) {
		t.Helper()
		e.step(what, "web", want, writes...)
	}

	// An edit that keeps the resourceVersion (no API server makes one)
	// shows what is not looked at: b's share did not change.
	edit("10.9.9.9", "")
	web := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	web.Ready = false
	e.table.Upsert(web)
	step("a's Pod not ready", map[string][]string{"a": {"10.0.0.1"}, "b": {"10.9.9.9"}}, "patch endpointslices ")

	edit("10.9.9.8", "edited")
	step("b's slice edited", map[string][]string{"a": {"10.0.0.1"}, "b": {"10.0.0.2"}}, "patch endpointslices ")
	held("10.0.0.2")

	e.ctl.queue.Add(keyAll)
	step("a full reconcile", map[string][]string{"a": {"10.0.0.1"}, "b": {"10.0.0.2"}})
}

// A share of two slices (one per address family) whose write of one slice
// fails keeps no memo: the next reconcile builds the share again and writes
// that slice, though the other one is as written.
func TestReconcileRetriesAFailedSliceOfAMemoizedShare(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())})
	web := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	web.IPs = append(web.IPs, netip.MustParseAddr("fd00::1"))
	e.table.Upsert(web)
	var failV6 atomic.Bool
	e.client.PrependReactor("patch", "endpointslices", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if pa, ok := a.(clienttesting.PatchAction); ok && failV6.Load() && strings.Contains(string(pa.GetPatch()), `"addressType":"IPv6"`) {
			return true, nil, fmt.Errorf("slice refused")
		}
		return false, nil, nil
	})
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	addrs := func() []string {
		var out []string
		for _, s := range e.slices() {
			for _, ep := range s.Endpoints {
				out = append(out, ep.Addresses...)
			}
		}
		slices.Sort(out)
		return out
	}
	if got := addrs(); !slices.Equal(got, []string{"10.0.0.1", "fd00::1"}) {
		t.Fatalf("slices hold %v", got)
	}
	// Both slices edited by someone else (new resourceVersions); the
	// write-back of the IPv6 one fails once.
	gvr := discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	for _, s := range e.slices() {
		if s.AddressType == discoveryv1.AddressTypeIPv4 {
			s.Endpoints[0].Addresses = []string{"10.9.9.9"}
		} else {
			s.Endpoints[0].Addresses = []string{"fd00::9"}
		}
		s.ResourceVersion = "edited-" + string(s.AddressType)
		if err := e.client.Tracker().Update(gvr, &s, s.Namespace); err != nil {
			t.Fatal(err)
		}
	}
	e.poll("the informer to see the edits", func() bool {
		n := 0
		for _, o := range e.ctl.slices.List() {
			if strings.HasPrefix(o.(*discoveryv1.EndpointSlice).ResourceVersion, "edited-") {
				n++
			}
		}
		return n == 2
	})
	failV6.Store(true)
	e.ctl.queue.Add(keyAll)
	if err := e.ctl.Reconcile(e.ctx); err == nil {
		t.Fatal("the reconcile whose IPv6 slice write failed returned no error")
	}
	failV6.Store(false)
	// The service waits out its backoff: reconciles until it is synced.
	e.poll("the IPv6 slice written back", func() bool {
		e.ctl.queue.Add(keyAll)
		_ = e.ctl.Reconcile(e.ctx)
		return slices.Equal(addrs(), []string{"10.0.0.1", "fd00::1"})
	})
}

// The first reconcile waits for every cluster's first list (at most
// FirstLists): a service two clusters export gets one ServiceImport apply
// with both, not one with the cluster that listed first and another when
// the second lists. A cluster that does not list within FirstLists is not
// waited for.
func TestFirstReconcileWaitsForFirstLists(t *testing.T) {
	imports := func(writes []string) int {
		n := 0
		for _, w := range writes {
			if w == "patch serviceimports " {
				n++
			}
		}
		return n
	}
	t.Run("both list", func(t *testing.T) {
		a, b := newSource("a", true, time.Now()), newSource("b", false, time.Now())
		e := newEnv(t, Config{FirstLists: 10 * time.Second}, []*fakeSource{a, b})
		e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeHeadless))
		e.start(true)
		e.waitSynced()
		// b lists a while after the informers synced (long enough for a
		// loop that does not wait to have written a's share alone).
		time.Sleep(200 * time.Millisecond)
		e.table.Upsert(exporter("b", "web", "10.0.1.1", annotation.TypeHeadless))
		b.synced.Store(true)
		e.poll("web's import of both clusters", func() bool {
			im := e.serviceImport("web")
			return im != nil && slices.Equal(importClusters(im), []string{"a", "b"})
		})
		if n := imports(e.writes()); n != 1 {
			t.Errorf("%d applies of web's ServiceImport, want 1: %v", n, e.writes())
		}
	})
	t.Run("one never lists", func(t *testing.T) {
		a, b := newSource("a", true, time.Now()), newSource("b", false, time.Now())
		e := newEnv(t, Config{FirstLists: 100 * time.Millisecond}, []*fakeSource{a, b})
		e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeHeadless))
		e.start(true)
		e.poll("web's import of a", func() bool {
			im := e.serviceImport("web")
			return im != nil && slices.Equal(importClusters(im), []string{"a"})
		})
	})
}
