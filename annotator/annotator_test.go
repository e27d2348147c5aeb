package annotator

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

var seGVR = schema.GroupVersionResource{Group: mcsapi.Group, Version: "v1beta1", Resource: "serviceexports"}

func serviceExport(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(mcsapi.Group + "/v1beta1")
	u.SetKind("ServiceExport")
	u.SetNamespace("ns")
	u.SetName(name)
	u.SetGeneration(1)
	return u
}

// fixture is a Controller over fake clients, its workers running.
type fixture struct {
	t      *testing.T
	ctl    *Controller
	client *fake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	m      *Metrics
}

func start(t *testing.T, withCRD bool, objs []runtime.Object, exports ...*unstructured.Unstructured) *fixture {
	t.Helper()
	return startWith(t, Config{Cluster: "edge-a", ServiceExportPoll: time.Hour}, withCRD, objs, exports...)
}

func startWith(t *testing.T, cfg Config, withCRD bool, objs []runtime.Object, exports ...*unstructured.Unstructured) *fixture {
	t.Helper()
	return startHooked(t, cfg, nil, withCRD, objs, exports...)
}

// startHooked is startWith with hook run on the fake clientset before the
// controller starts (to add reactors).
func startHooked(t *testing.T, cfg Config, hook func(*fake.Clientset), withCRD bool, objs []runtime.Object, exports ...*unstructured.Unstructured) *fixture {
	t.Helper()
	client := fake.NewClientset(objs...)
	if hook != nil {
		hook(client)
	}
	if withCRD {
		client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
			GroupVersion: mcsapi.Group + "/v1beta1",
			APIResources: []metav1.APIResource{{Name: "serviceexports", Namespaced: true, Kind: "ServiceExport"}},
		}}
	}
	var dynObjs []runtime.Object
	for _, e := range exports {
		dynObjs = append(dynObjs, e)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{seGVR: "ServiceExportList"}, dynObjs...)
	dyn.PrependReactor("patch", "serviceexports", applyStatus(dyn))
	m := NewMetrics(nil)
	ctl := New(client, dyn, client.Discovery(), cfg, m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10 s of its context's end")
		}
	})
	if err := ctl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	go func() { defer close(done); ctl.Run(ctx) }()
	return &fixture{t: t, ctl: ctl, client: client, dyn: dyn, m: m}
}

// applyStatus stands in for the API server's server-side apply of a
// ServiceExport's status, which the fake dynamic client lacks: the applied
// conditions replace those of the same type (conditions are a list keyed by
// type), the others stay.
func applyStatus(dyn *dynamicfake.FakeDynamicClient) k8stesting.ReactionFunc {
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		pa, ok := action.(k8stesting.PatchAction)
		if !ok || pa.GetPatchType() != types.ApplyPatchType || pa.GetSubresource() != "status" {
			return false, nil, nil
		}
		var applied unstructured.Unstructured
		if err := json.Unmarshal(pa.GetPatch(), &applied.Object); err != nil {
			return true, nil, err
		}
		obj, err := dyn.Tracker().Get(seGVR, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		u := obj.(*unstructured.Unstructured).DeepCopy()
		have, err := readConditions(u)
		if err != nil {
			have = nil
		}
		mine, err := readConditions(&applied)
		if err != nil {
			return true, nil, err
		}
		for _, c := range mine {
			meta.SetStatusCondition(&have, c)
		}
		list := make([]any, len(have))
		for i := range have {
			list[i], _ = runtime.DefaultUnstructuredConverter.ToUnstructured(&have[i])
		}
		if err := unstructured.SetNestedSlice(u.Object, list, "status", "conditions"); err != nil {
			return true, nil, err
		}
		return true, u, dyn.Tracker().Update(seGVR, u, pa.GetNamespace())
	}
}

// eventually polls f for at most 10 s.
func (f *fixture) eventually(what string, cond func() error) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) pod(name string) *corev1.Pod {
	f.t.Helper()
	p, err := f.client.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// podHas checks pod's export annotation (want "" for none) and label.
func (f *fixture) podHas(name, want string) func() error {
	return func() error {
		p := f.pod(name)
		got, has := p.Annotations[annotation.ExportAnnotation]
		label := p.Labels[annotation.ExporterLabel] == annotation.LabelValue
		if got != want || has != (want != "") || label != (want != "") {
			return fmt.Errorf("Pod %s: annotation %q (set %v), label %v; want %q", name, got, has, label, want)
		}
		return nil
	}
}

func (f *fixture) conditions(name string) map[string]string {
	f.t.Helper()
	u, err := f.dyn.Resource(seGVR).Namespace("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	conds, err := readConditions(u)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range conds {
		out[c.Type] = string(c.Status) + "/" + c.Reason
		if c.ObservedGeneration != 1 || c.LastTransitionTime.IsZero() || c.Message == "" {
			f.t.Errorf("condition %+v: want observedGeneration 1, a transition time and a message", c)
		}
	}
	return out
}

func TestControllerExports(t *testing.T) {
	backend := svc("backend", app, sport("http", 80, intstr.FromString("web"), corev1.ProtocolTCP))
	db := svc("db", map[string]string{"app": "db"}) // exported by its ServiceExport only
	delete(db.Annotations, annotation.ExportServiceAnnotation)
	ext := svc("ext", nil)
	ext.Spec.Type = corev1.ServiceTypeExternalName
	web := pod("web", app, corev1.ContainerPort{Name: "web", ContainerPort: 8080})
	dbPod := pod("db-0", map[string]string{"app": "db"})
	done := pod("done", app)
	done.Status.Phase = corev1.PodSucceeded
	hand := pod("hand", map[string]string{"app": "other", annotation.ExporterLabel: "true"})
	hand.Annotations = map[string]string{annotation.ExportAnnotation: `{"services":[{"name":"manual"}]}`}

	f := start(t, true, []runtime.Object{backend, db, ext, web, dbPod, done, hand},
		serviceExport("db"), serviceExport("ext"), serviceExport("ghost"))

	wantWeb := `{"services":[{"name":"backend","namespace":"ns","cluster":"edge-a","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}],"type":"ClusterSetIP"}]}`
	wantDB := `{"services":[{"name":"db","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"}]}`
	f.eventually("exported by annotation", f.podHas("web", wantWeb))
	f.eventually("exported by ServiceExport", f.podHas("db-0", wantDB))
	f.eventually("status conditions", func() error {
		for name, want := range map[string]map[string]string{
			"db":    {"Valid": "True/Valid", "Ready": "True/Exported", "Conflict": "False/NoConflicts"},
			"ext":   {"Valid": "False/InvalidServiceType", "Ready": "False/Failed", "Conflict": "False/NoConflicts"},
			"ghost": {"Valid": "False/NoService", "Ready": "False/Failed", "Conflict": "False/NoConflicts"},
		} {
			if got := f.conditions(name); fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("ServiceExport %s: %v, want %v", name, got, want)
			}
		}
		return nil
	})
	if err := f.podHas("done", "")(); err != nil {
		t.Errorf("a Pod that ended was written: %v", err)
	}
	f.eventually("gauges", func() error { // set as a reconcile ends, after its writes
		if e, a := testutil.ToFloat64(f.m.ExportedServices), testutil.ToFloat64(f.m.AnnotatedPods); e != 2 || a != 2 {
			return fmt.Errorf("exported_services %v, annotated_pods %v; want 2 (backend, db), 2 (web, db-0)", e, a)
		}
		return nil
	})
	if got := testutil.ToFloat64(f.m.Skipped.WithLabelValues(skipExternalName)); got != 1 {
		t.Errorf("skipped{external_name} = %v, want 1 (counted once, not per reconcile)", got)
	}

	// Nothing exports backend any more: what the annotator wrote goes; the
	// hand-written annotation of a Pod it never wrote stays.
	backend = backend.DeepCopy()
	delete(backend.Annotations, annotation.ExportServiceAnnotation)
	if _, err := f.client.CoreV1().Services("ns").Update(context.Background(), backend, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("unexported by annotation", f.podHas("web", ""))
	// And the ServiceExport's deletion unexports db.
	if err := f.dyn.Resource(seGVR).Namespace("ns").Delete(context.Background(), "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("unexported by ServiceExport deletion", f.podHas("db-0", ""))
	if err := f.podHas("hand", `{"services":[{"name":"manual"}]}`)(); err != nil {
		t.Errorf("a hand-written annotation was touched: %v", err)
	}
	f.eventually("gauges", func() error {
		if e, a := testutil.ToFloat64(f.m.ExportedServices), testutil.ToFloat64(f.m.AnnotatedPods); e != 0 || a != 0 {
			return fmt.Errorf("exported_services %v, annotated_pods %v; want 0, 0", e, a)
		}
		return nil
	})
	// Two writes and two removals at least (a reconcile that runs before
	// the informer sees its own write applies the same again, harmlessly);
	// once settled, a reconcile writes nothing.
	writes := testutil.ToFloat64(f.m.PodWrites.WithLabelValues("ok"))
	if writes < 4 {
		t.Errorf("pod_writes_total{ok} = %v, want at least 4", writes)
	}
	if err := f.ctl.Reconcile(context.Background(), "ns"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(f.m.PodWrites.WithLabelValues("ok")); got != writes {
		t.Errorf("a settled namespace's reconcile wrote %v Pods", got-writes)
	}
	if got := testutil.ToFloat64(f.m.PodWrites.WithLabelValues("error")); got != 0 {
		t.Errorf("pod_writes_total{error} = %v", got)
	}
}

// A Pod that comes later, or whose labels change, is written then; without
// the CRD, Services are exported by annotation alone.
func TestControllerFollowsPods(t *testing.T) {
	f := start(t, false, []runtime.Object{svc("backend", app)})
	if f.ctl.exports.Load() != nil {
		t.Fatal("ServiceExports watched with no CRD served")
	}
	p, err := f.client.CoreV1().Pods("ns").Create(context.Background(), pod("late", map[string]string{"app": "x"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"services":[{"name":"backend","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"}]}`
	p.Labels = app
	if _, err := f.client.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("relabelled Pod exported", f.podHas("late", want))
}

// A malformed status on a ServiceExport (someone else's write) is replaced,
// not a reconcile that fails for ever.
func TestControllerReplacesUnreadableStatus(t *testing.T) {
	se := serviceExport("db")
	if err := unstructured.SetNestedSlice(se.Object, []any{"not a condition"}, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	f := start(t, true, []runtime.Object{svc("db", map[string]string{"app": "db"})}, se)
	f.eventually("status replaced", func() error {
		u, err := f.dyn.Resource(seGVR).Namespace("ns").Get(context.Background(), "db", metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, err := readConditions(u)
		if err != nil || len(conds) != 3 {
			return fmt.Errorf("%d conditions, %v", len(conds), err)
		}
		return nil
	})
}

func TestEnqueueTombstone(t *testing.T) {
	c := New(fake.NewClientset(), nil, nil, Config{}, nil)
	defer c.queue.ShutDown()
	c.enqueue(cache.DeletedFinalStateUnknown{Key: "ns2/p", Obj: pod("p", nil)})
	c.enqueue("not an object")
	if c.queue.Len() != 1 {
		t.Fatalf("queue has %d keys, want 1", c.queue.Len())
	}
	if ns, _ := c.queue.Get(); ns != "ns" {
		t.Errorf("queued %q, want the tombstone's namespace", ns)
	}
}

func TestSameButVersion(t *testing.T) {
	a := pod("p", app)
	a.ResourceVersion = "1"
	b := a.DeepCopy()
	b.ResourceVersion = "2"
	if !sameButVersion(a, b) {
		t.Error("Pods differing in resource version only: want same")
	}
	b.Labels = map[string]string{"app": "other"}
	if sameButVersion(a, b) {
		t.Error("relabelled Pod: want different")
	}
	s1, s2 := svc("s", app), svc("s", app)
	s1.ResourceVersion, s2.ResourceVersion = "1", "2"
	s2.Spec.Type = corev1.ServiceTypeExternalName
	if sameButVersion(s1, s2) {
		t.Error("Service changed type: want different")
	}
	if sameButVersion(a, s1) {
		t.Error("a Pod and a Service: want different")
	}
	e1, e2 := serviceExport("db"), serviceExport("db")
	e1.SetResourceVersion("1")
	e2.SetResourceVersion("2")
	if err := unstructured.SetNestedSlice(e2.Object, []any{map[string]any{"type": "Ready"}}, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if !sameButVersion(e1, e2) {
		t.Error("a ServiceExport whose status alone changed (the annotator's own write): want same")
	}
	e2.SetGeneration(2)
	if sameButVersion(e1, e2) {
		t.Error("a ServiceExport whose spec changed: want different")
	}
}

// The transforms keep what the annotator reads and drop the rest.
func TestSlimPod(t *testing.T) {
	p := pod("p", app, corev1.ContainerPort{Name: "web", ContainerPort: 8080})
	p.Annotations = map[string]string{annotation.ExportAnnotation: "x", "big": "y"}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "noports", Image: "i"})
	p.Spec.NodeName = "n"
	p.Status.PodIP = "10.0.0.1"
	p.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kubectl", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{"f:` + annotation.ExportAnnotation + `":{}}}}`)}},
		{Manager: FieldManager, FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:` + annotation.ExporterLabel + `":{}}}}`)}},
	}
	out, _ := slimPod(p)
	s := out.(*corev1.Pod)
	if s.Annotations["big"] != "" || s.Annotations[annotation.ExportAnnotation] != "x" || s.Spec.NodeName != "" || s.Status.PodIP != "" {
		t.Errorf("kept too much or too little: %+v", s)
	}
	if len(s.Spec.Containers) != 1 || s.Spec.Containers[0].Ports[0].ContainerPort != 8080 {
		t.Errorf("containers %+v, want the one with ports", s.Spec.Containers)
	}
	if len(s.ManagedFields) != 1 || !ownedExport(s) {
		t.Errorf("managedFields %+v: want only the annotator's, owning the label", s.ManagedFields)
	}
	s.ManagedFields = nil
	if export, imports := inSync(s, "", "", false); ownedExport(s) || !export || !imports {
		t.Error("with no entry of the annotator's: not owned, and nothing to remove")
	}
	// The transform may see its own output again (client-go's informers
	// may transform an object twice): it keeps what it kept.
	p.Annotations[annotation.ImportAnnotation] = `{"services":[{"name":"db"}]}`
	once, _ := slimPod(p)
	twice, _ := slimPod(once)
	if !reflect.DeepEqual(once, twice) || !imports(twice.(*corev1.Pod)) {
		t.Errorf("a second pass changed the slim Pod:\n%+v\n%+v", once, twice)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/p"}
	if got, _ := slimPod(tomb); got != tomb {
		t.Error("a tombstone was not passed through")
	}
}

// With a key, each annotation is signed for its Pod (the plugin's Verify
// accepts it); a Pod recreated under the same name gets a new signature.
func TestControllerSigns(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := startWith(t, Config{Cluster: "edge-a", SignKey: key}, false, []runtime.Object{svc("backend", app), pod("p", app)})
	want := `{"services":[{"name":"backend","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"}]}`
	verified := func() error {
		if err := f.podHas("p", want)(); err != nil {
			return err
		}
		p := f.pod("p")
		if r, ok := annotation.Verify(pub, p.Annotations[annotation.SignatureAnnotation], "edge-a", "ns", "p", string(p.UID), want); !ok {
			return fmt.Errorf("Pod p (UID %s): %v", p.UID, r)
		}
		return nil
	}
	f.eventually("signed", verified)

	// The Pod is recreated with another UID: the old signature no longer
	// verifies, and the annotator signs again.
	if err := f.client.CoreV1().Pods("ns").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := pod("p", app)
	again.UID = "uid-2"
	again.Annotations = map[string]string{annotation.ExportAnnotation: want, annotation.SignatureAnnotation: "ed25519:stale"}
	if _, err := f.client.CoreV1().Pods("ns").Create(context.Background(), again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("signed again for the new UID", verified)

	// Another exported Service selects it: the new value is signed (the
	// remembered signature is for the old one).
	if _, err := f.client.CoreV1().Services("ns").Create(context.Background(), svc("api", app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = `{"services":[{"name":"api","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"},{"name":"backend","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"}]}`
	f.eventually("the changed value signed", verified)
}

func TestInSyncSignature(t *testing.T) {
	const want, sig = "value", "ed25519:sig"
	ours := []metav1.ManagedFieldsEntry{{Manager: FieldManager, FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{"f:` + annotation.ExportAnnotation + `":{},"f:` + annotation.SignatureAnnotation + `":{}}}}`)}}}
	theirs := []metav1.ManagedFieldsEntry{{Manager: "kubectl", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{"f:` + annotation.SignatureAnnotation + `":{}}}}`)}}}
	for _, tc := range []struct {
		name    string
		annos   map[string]string
		mf      []metav1.ManagedFieldsEntry
		wantSig string
		inSync  bool
	}{
		{"signed as wanted", map[string]string{annotation.ExportAnnotation: want, annotation.SignatureAnnotation: sig}, ours, sig, true},
		{"unsigned, signing", map[string]string{annotation.ExportAnnotation: want}, ours, sig, false},
		{"another signature", map[string]string{annotation.ExportAnnotation: want, annotation.SignatureAnnotation: "ed25519:old"}, ours, sig, false},
		{"our signature, signing no more", map[string]string{annotation.ExportAnnotation: want, annotation.SignatureAnnotation: sig}, ours, "", false},
		{"someone else's signature, not signing: theirs", map[string]string{annotation.ExportAnnotation: want, annotation.SignatureAnnotation: sig}, theirs, "", true},
		{"another value", map[string]string{annotation.ExportAnnotation: "other", annotation.SignatureAnnotation: sig}, ours, sig, false},
	} {
		p := pod("p", map[string]string{annotation.ExporterLabel: annotation.LabelValue})
		p.Annotations, p.ManagedFields = tc.annos, tc.mf
		if got, imports := inSync(p, want, tc.wantSig, false); got != tc.inSync || !imports {
			t.Errorf("%s: inSync = %v, want %v", tc.name, got, tc.inSync)
		}
	}
}

// A Pod write that fails (here Forbidden, as with a missing RBAC verb) is
// counted, reported in the ServiceExport's Ready condition and retried with
// backoff; once writes go through, the Pod is annotated and Ready turns True.
func TestControllerWriteFails(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	deny := func(c *fake.Clientset) {
		c.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			if failing.Load() {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("no patch"))
			}
			return false, nil, nil
		})
	}
	db := svc("db", map[string]string{"app": "db"})
	f := startHooked(t, Config{Cluster: "edge-a", ServiceExportPoll: time.Hour}, deny, true,
		[]runtime.Object{db, pod("db-0", map[string]string{"app": "db"})}, serviceExport("db"))
	f.eventually("the failure reported", func() error {
		if n := testutil.ToFloat64(f.m.PodWrites.WithLabelValues("error")); n == 0 {
			return errors.New("no failed write counted")
		}
		if got := f.conditions("db")["Ready"]; got != "False/Failed" {
			return fmt.Errorf("Ready %s, want False/Failed", got)
		}
		if n := testutil.ToFloat64(f.m.Reconciles.WithLabelValues("error")); n == 0 {
			return errors.New("no failed reconcile counted")
		}
		return nil
	})
	failing.Store(false)
	f.eventually("retried", f.podHas("db-0", `{"services":[{"name":"db","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"}]}`))
	f.eventually("Ready again", func() error {
		if got := f.conditions("db")["Ready"]; got != "True/Exported" {
			return fmt.Errorf("Ready %s, want True/Exported", got)
		}
		return nil
	})
}

// A Pod with an import annotation gets the importer label; when the
// annotation goes, the label goes too, unless someone else set it. A blank
// annotation imports nothing. The export side of a Pod that also exports is
// untouched.
func TestImporterLabel(t *testing.T) {
	importing := func(name string, lbls map[string]string, value string) *corev1.Pod {
		p := pod(name, lbls)
		p.Annotations = map[string]string{annotation.ImportAnnotation: value}
		return p
	}
	const imp = `{"services":[{"name":"db","namespace":"other"}]}`
	users := importing("users-label", map[string]string{annotation.ImporterLabel: annotation.LabelValue}, imp)
	users.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:` + annotation.ImporterLabel + `":{}}}}`)}}}
	f := startWith(t, Config{}, false, []runtime.Object{
		svc("backend", app),
		importing("client", nil, imp),
		importing("both", app, imp),
		importing("blank", nil, "  "),
		users,
	})
	labelled := func(name string, want bool) func() error {
		return func() error {
			if got := f.pod(name).Labels[annotation.ImporterLabel] == annotation.LabelValue; got != want {
				return fmt.Errorf("Pod %s: importer label %v, want %v (labels %v)", name, got, want, f.pod(name).Labels)
			}
			return nil
		}
	}
	f.eventually("client labelled", labelled("client", true))
	f.eventually("both labelled", labelled("both", true))
	f.eventually("both exported", f.podHas("both", `{"services":[{"name":"backend","namespace":"ns","type":"ClusterSetIP"}]}`))
	if owns(f.pod("users-label"), fieldImporter) {
		t.Error("users-label: the annotator took the label its user set (nothing needed writing)")
	}
	if err := labelled("blank", false)(); err != nil {
		t.Error(err)
	}
	importerPods := func(want float64) func() error {
		return func() error {
			if got := testutil.ToFloat64(f.m.ImporterPods); got != want {
				return fmt.Errorf("importer_pods = %v, want %v", got, want)
			}
			return nil
		}
	}
	f.eventually("importer_pods", importerPods(3))

	// The import annotations go: the labels the annotator set go with them,
	// the user's stays, the export stays.
	for _, name := range []string{"client", "both", "users-label"} {
		p := f.pod(name)
		delete(p.Annotations, annotation.ImportAnnotation)
		if _, err := f.client.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{FieldManager: "kubectl"}); err != nil {
			t.Fatal(err)
		}
	}
	f.eventually("client unlabelled", labelled("client", false))
	f.eventually("both unlabelled", labelled("both", false))
	f.eventually("importer_pods", importerPods(0))
	if err := f.podHas("both", `{"services":[{"name":"backend","namespace":"ns","type":"ClusterSetIP"}]}`)(); err != nil {
		t.Error(err)
	}
	if err := labelled("users-label", true)(); err != nil {
		t.Error(err)
	}
}

// With RecordFields the Pod informer keeps, on a Pod with the exporter
// label, what the MCS controller's record of it reads (addresses, hostname,
// readiness), and only there; a change of only those fields queues
// nothing, since the annotator does not read them (unless SignEndpoints).
func TestRecordFields(t *testing.T) {
	p := pod("p", map[string]string{"app": "web", annotation.ExporterLabel: annotation.LabelValue})
	p.ResourceVersion = "1"
	p.Spec.Hostname = "h"
	p.Status.PodIP, p.Status.PodIPs = "10.0.0.1", []corev1.PodIP{{IP: "10.0.0.1"}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
	out, _ := slimPodRecord(p)
	s := out.(*corev1.Pod)
	if s.Spec.Hostname != "h" || len(s.Status.PodIPs) != 1 || len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Type != corev1.PodReady {
		t.Errorf("exported Pod: kept %+v %+v, want hostname, addresses and the Ready condition", s.Spec, s.Status)
	}
	plain := p.DeepCopy()
	delete(plain.Labels, annotation.ExporterLabel)
	out, _ = slimPodRecord(plain)
	if s := out.(*corev1.Pod); s.Spec.Hostname != "" || s.Status.PodIP != "" || len(s.Status.Conditions) != 0 {
		t.Errorf("Pod without the exporter label: kept %+v %+v, want what slimPod keeps", s.Spec, s.Status)
	}

	for _, signEndpoints := range []bool{false, true} {
		c := New(fake.NewClientset(), nil, nil, Config{RecordFields: true, SignEndpoints: signEndpoints}, nil)
		old, _ := slimPodRecord(p)
		q := p.DeepCopy()
		q.ResourceVersion = "2"
		q.Status.Conditions[0].Status = corev1.ConditionFalse
		cur, _ := slimPodRecord(q)
		c.handler().OnUpdate(old, cur)
		if got, want := c.queue.Len(), map[bool]int{false: 0, true: 1}[signEndpoints]; got != want {
			t.Errorf("SignEndpoints %v: a readiness change queued %d namespaces, want %d", signEndpoints, got, want)
		}
		c.queue.ShutDown()
	}
}
