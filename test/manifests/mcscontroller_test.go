package manifests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/mcs-api/config/crd"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The MCS controller's contract (docs/DESIGN.md#the-mcs-controller), written
// out here, not imported from internal/mcscontroller, so that the manifests
// are checked against it.
const (
	// mcsManagedBy is the value of the managed-by labels of everything the
	// controller writes: app.kubernetes.io/managed-by on ServiceImports and
	// derived Services, endpointslice.kubernetes.io/managed-by on slices.
	mcsManagedBy     = "mcs-controller.mcsannotations.io"
	labelAppManaged  = "app.kubernetes.io/managed-by"
	labelMCSService  = "multicluster.kubernetes.io/service-name"
	annotationHashed = "multicluster.mcsannotations.io/applied"
)

var serviceImports = schema.GroupVersionResource{Group: serviceExportGroup, Version: "v1beta1", Resource: "serviceimports"}

// TestCRDs: manifests/crds holds the MCS CRDs exactly as the mcs-api module
// of go.mod ships them, and the base installs them.
func TestCRDs(t *testing.T) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string][]byte{
		"multicluster.x-k8s.io_serviceexports.yaml": crd.ServiceExportCRD,
		"multicluster.x-k8s.io_serviceimports.yaml": crd.ServiceImportCRD,
	} {
		got, err := os.ReadFile(filepath.Join(root, "manifests", "crds", file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("manifests/crds/%s differs from sigs.k8s.io/mcs-api's config/crd: copy it again after a go.mod change", file)
		}
	}
	base := manifests(t, "base")
	for _, name := range []string{"serviceexports." + serviceExportGroup, "serviceimports." + serviceExportGroup} {
		find(t, base, "CustomResourceDefinition", name)
	}
}

// TestMCSControllerManifests applies manifests/crds and manifests/annotator
// to a real kube-apiserver and runs bin/mcs-annotator with the Deployment's
// arguments (the MCS controller on) as the mcs-annotator ServiceAccount
// (impersonation). The controller must write the ServiceImport, the derived
// Service and the EndpointSlice of an exported ClusterIP Service and the
// ServiceExport's Conflict condition, delete the relay Lease of a cluster
// it no longer reads, and never be forbidden. Then, with
// the same identity, the admission policy refuses what RBAC allows but the
// controller never writes (a Service with a selector or external IPs, a
// change to a Service, EndpointSlice or ServiceImport not its own, a slice
// that would feed a Service not its own) and lets through what it does
// write; with the policy's binding removed, RBAC alone lets the refused
// write through.
func TestMCSControllerManifests(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	c := harness.StartCluster(t, "edge-a")
	waitNamespace(t, c, kubeSystem)
	apply(t, c, manifests(t, "crds"))
	dyn := c.Dynamic(t)
	harness.Eventually(t, 30*time.Second, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := dyn.Resource(serviceImports).List(cx, metav1.ListOptions{Limit: 1})
		return err
	})
	m := readAnnotator(t)
	apply(t, c, m.objs)

	ns := c.NewNamespace(t)
	createService(t, c, ns, "web", nil, map[string]string{"app": "web"}, "",
		corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP})
	createServiceExport(t, dyn, ns, "web")
	c.CreatePodObject(t, harness.Pod{Name: "web-0", Labels: map[string]string{"app": "web"}}.Object(ns))
	c.SetPodReady(t, ns, "web-0", true, "10.1.0.10")

	kubeconfig := c.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, annotatorSA), harness.ServiceAccountGroups(kubeSystem)...)
	// A Lease the hub wrote before of a cluster it no longer reads: it
	// deletes it after --relay-lease-grace.
	gone := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "mcs-origin.edge-gone", Namespace: kubeSystem,
		Labels: map[string]string{"multicluster.mcsannotations.io/relay-origin": "edge-gone"}}}
	if _, err := c.Client.CoordinationV1().Leases(kubeSystem).Create(context.Background(), gone, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// As a relay hub too (--relay): its Leases go through the RBAC and the
	// admission policy as well.
	ctl := harness.StartAnnotator(t, kubeconfig, append(annotatorArgs(t, &m.deployment, "edge-a"), "--relay", "--relay-lease-grace=1s")...)

	// The controller's writes, as the ServiceAccount.
	var imp *unstructured.Unstructured
	var derived *corev1.Service
	var slice *discoveryv1.EndpointSlice
	harness.Eventually(t, 30*time.Second, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		u, err := dyn.Resource(serviceImports).Namespace(ns).Get(cx, "web", metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("ServiceImport: %w; controller log:\n%s", err, harness.Tail(ctl.Process().LogPath, 20))
		}
		ips, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "ips")
		if len(ips) == 0 {
			return fmt.Errorf("ServiceImport without ClusterSetIPs yet")
		}
		svcs, err := c.Client.CoreV1().Services(ns).List(cx, metav1.ListOptions{LabelSelector: labelAppManaged + "=" + mcsManagedBy})
		if err != nil || len(svcs.Items) != 1 || svcs.Items[0].Spec.ClusterIP != ips[0] {
			return fmt.Errorf("derived Services %v (%v), want one with ClusterIP %s", svcs, err, ips[0])
		}
		sls, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(cx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + mcsManagedBy})
		if err != nil || len(sls.Items) != 1 {
			return fmt.Errorf("the controller's EndpointSlices %v (%v), want one", sls, err)
		}
		if _, ok := sls.Items[0].Annotations["multicluster.mcsannotations.io/relay"]; !ok {
			return fmt.Errorf("the controller's EndpointSlice has no relay annotation")
		}
		if l, err := c.Client.CoordinationV1().Leases(kubeSystem).Get(cx, "mcs-origin.edge-a", metav1.GetOptions{}); err != nil ||
			l.Annotations["multicluster.mcsannotations.io/origin-state"] != "connected" {
			return fmt.Errorf("the relay Lease of edge-a: %v (%v)", l, err)
		}
		if _, err := c.Client.CoordinationV1().Leases(kubeSystem).Get(cx, gone.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the relay Lease of a cluster the hub no longer reads: %v, want deleted", err)
		}
		imp, derived, slice = u, &svcs.Items[0], &sls.Items[0]
		return exportConditions(dyn, ns, "web", map[string]condition{"Conflict": {"False", "NoConflicts"}, "Ready": {"True", "Exported"}})
	})
	if v, err := metric(ctl, `mcs_controller_writes_total{kind="lease_delete",result="ok"}`); err != nil || v != 1 {
		t.Errorf("Lease deletes %v (%v), want 1", v, err)
	}
	for _, l := range strings.Split(ctl.Log(), "\n") {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			t.Errorf("the controller was forbidden something: %s", l)
		}
	}
	for _, kind := range []string{"serviceimport", "serviceimport_status", "service", "endpointslice", "serviceexport_status", "lease", "lease_delete"} {
		if v, err := metric(ctl, fmt.Sprintf(`mcs_controller_writes_total{kind=%q,result="error"}`, kind)); err != nil || v != 0 {
			t.Errorf("%s write errors %v (%v), want 0", kind, v, err)
		}
	}

	sa, sadyn := clientsOf(t, kubeconfig)
	w := mcsWrites{t: t, ns: ns, sa: sa, sadyn: sadyn, imp: imp}

	// A Service as the controller writes its derived ones, but with a selector:
	// RBAC allows its create, the policy must refuse it.
	withSelector := w.derivedLike("evil-mcs-0a0b0c")
	withSelector.Spec.Selector = map[string]string{"app": "web"}
	harness.Eventually(t, 20*time.Second, func() error {
		if err := w.createService(withSelector); !refusedByPolicy(err, m.policy.Name) {
			return fmt.Errorf("a derived-looking Service with a selector: %v, want refused by %s", err, m.policy.Name)
		}
		return nil
	})

	refused := func(what string, err error) {
		t.Helper()
		if !refusedByPolicy(err, m.policy.Name) {
			t.Errorf("%s as the controller: %v, want Forbidden by ValidatingAdmissionPolicy %s", what, err, m.policy.Name)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s as the controller: %v, want allowed", what, err)
		}
	}
	cx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	dryPatch := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}

	// Services.
	ext := w.derivedLike("evil-mcs-0a0b0d")
	ext.Spec.ExternalIPs = []string{"192.0.2.1"}
	refused("create a selector-less Service with external IPs", w.createService(ext))
	noHash := w.derivedLike("evil-mcs-0a0b0e")
	delete(noHash.Annotations, annotationHashed)
	refused("create a Service without the applied hash", w.createService(noHash))
	unowned := w.derivedLike("evil-mcs-0a0b0f")
	unowned.OwnerReferences = nil
	refused("create a Service no ServiceImport owns", w.createService(unowned))
	refused("create a Service of another name", w.createService(w.derivedLike("evil")))
	headless := w.derivedLike("evil-mcs-0a0b10")
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	refused("create a headless Service", w.createService(headless))
	_, err := sa.CoreV1().Services(ns).Patch(cx, "web", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, labelAppManaged, mcsManagedBy)), dryPatch)
	refused("take over a user's Service with the managed-by label", err)
	refused("delete a user's Service", sa.CoreV1().Services(ns).Delete(cx, "web", dryDelete))
	_, err = sa.CoreV1().Services(ns).Patch(cx, derived.Name, types.MergePatchType, []byte(`{"spec":{"selector":{"app":"web"}}}`), dryPatch)
	refused("give its derived Service a selector", err)
	allowed("create a derived Service as it writes them", w.createService(w.derivedLike("other-mcs-0a0b11")))
	_, err = sa.CoreV1().Services(ns).Patch(cx, derived.Name, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"0"}}}`, annotationHashed)), dryPatch)
	allowed("change its derived Service", err)
	allowed("delete its derived Service", sa.CoreV1().Services(ns).Delete(cx, derived.Name, dryDelete))

	// EndpointSlices.
	foreign := w.sliceLike("web-abcde", "web")
	foreign.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	_, err = sa.DiscoveryV1().EndpointSlices(ns).Create(cx, foreign, dry)
	refused("create an EndpointSlice managed by the default controller", err)
	feedsUser := w.sliceLike("web-feed", "web")
	_, err = sa.DiscoveryV1().EndpointSlices(ns).Create(cx, feedsUser, dry)
	refused("create an EndpointSlice of its own for a user's Service", err)
	noMCS := w.sliceLike("web-nomcs", derived.Name)
	delete(noMCS.Labels, labelMCSService)
	_, err = sa.DiscoveryV1().EndpointSlices(ns).Create(cx, noMCS, dry)
	refused("create an EndpointSlice that names no MCS service", err)
	if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(cx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("delete an EndpointSlice of the default controller", sa.DiscoveryV1().EndpointSlices(ns).Delete(cx, foreign.Name, dryDelete))
	_, err = sa.DiscoveryV1().EndpointSlices(ns).Patch(cx, foreign.Name, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, discoveryv1.LabelManagedBy, mcsManagedBy)), dryPatch)
	refused("take over an EndpointSlice of the default controller", err)
	_, err = sa.DiscoveryV1().EndpointSlices(ns).Create(cx, w.sliceLike("web-ours", derived.Name), dry)
	allowed("create an EndpointSlice as it writes them", err)
	_, err = sa.DiscoveryV1().EndpointSlices(ns).Create(cx, w.sliceLike("web-headless", ""), dry)
	allowed("create an EndpointSlice of a headless import (no kubernetes.io/service-name)", err)
	allowed("delete its EndpointSlice", sa.DiscoveryV1().EndpointSlices(ns).Delete(cx, slice.Name, dryDelete))

	// ServiceImports.
	si := &unstructured.Unstructured{Object: map[string]any{"apiVersion": serviceImports.GroupVersion().String(), "kind": "ServiceImport",
		"metadata": map[string]any{"name": "other", "namespace": ns},
		"spec":     map[string]any{"type": "Headless", "ports": []any{map[string]any{"port": int64(80), "protocol": "TCP"}}}}}
	_, err = sadyn.Resource(serviceImports).Namespace(ns).Create(cx, si, dry)
	refused("create a ServiceImport without its label", err)
	si.SetLabels(map[string]string{labelAppManaged: mcsManagedBy})
	_, err = sadyn.Resource(serviceImports).Namespace(ns).Create(cx, si, dry)
	allowed("create a ServiceImport with its label", err)
	if _, err := dyn.Resource(serviceImports).Namespace(ns).Create(cx, func() *unstructured.Unstructured {
		u := si.DeepCopy()
		u.SetName("foreign")
		u.SetLabels(nil)
		return u
	}(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("delete another controller's ServiceImport", sadyn.Resource(serviceImports).Namespace(ns).Delete(cx, "foreign", dryDelete))
	_, err = sadyn.Resource(serviceImports).Namespace(ns).Patch(cx, "foreign", types.MergePatchType,
		[]byte(`{"status":{"clusters":[{"cluster":"edge-a"}]}}`), dryPatch, "status")
	refused("change another controller's ServiceImport's status", err)
	allowed("delete its ServiceImport", sadyn.Resource(serviceImports).Namespace(ns).Delete(cx, "web", dryDelete))

	// Leases: a relay hub's (mcs-origin.<cluster>, labelled with the
	// cluster), never another component's in the namespace.
	originLease := func(name, origin string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeSystem,
			Labels: map[string]string{"multicluster.mcsannotations.io/relay-origin": origin}}}
	}
	_, err = sa.CoordinationV1().Leases(kubeSystem).Create(cx, originLease("mcs-origin.edge-b", "edge-b"), dry)
	allowed("create a relay hub's Lease of an origin", err)
	_, err = sa.CoordinationV1().Leases(kubeSystem).Create(cx, originLease("mcs-origin.edge-b", "edge-c"), dry)
	refused("create a relay hub's Lease labelled with another origin", err)
	_, err = sa.CoordinationV1().Leases(kubeSystem).Create(cx, originLease("kube-scheduler", "edge-b"), dry)
	refused("create another component's Lease", err)
	if _, err := c.Client.CoordinationV1().Leases(kubeSystem).Create(cx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: kubeSystem}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = sa.CoordinationV1().Leases(kubeSystem).Patch(cx, "kube-scheduler", types.MergePatchType, []byte(`{"spec":{"holderIdentity":"evil"}}`), dryPatch)
	refused("take another component's Lease", err)

	// An edge reading this cluster as a hub (manifests/hub-reader): the
	// controller's slices, with their relay annotation, and the relay
	// Leases; nothing else.
	apply(t, c, manifests(t, "hub-reader"))
	hubReader := harness.NewClient(t, c.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, "mcsannotations-hub-reader"), harness.ServiceAccountGroups(kubeSystem)...), 0)
	ok, forbidden := verdicts(t)
	harness.Eventually(t, 20*time.Second, func() error { // the grants just applied
		sls, err := hubReader.DiscoveryV1().EndpointSlices("").List(cx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + mcsManagedBy})
		if err != nil || len(sls.Items) == 0 || sls.Items[0].Annotations["multicluster.mcsannotations.io/relay"] == "" {
			return fmt.Errorf("the hub reader lists the controller's slices: %v (%v)", sls, err)
		}
		return nil
	})
	wt, err := hubReader.DiscoveryV1().EndpointSlices(ns).Watch(cx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + mcsManagedBy})
	ok("the hub reader watches slices", err)
	if err == nil {
		wt.Stop()
	}
	_, err = hubReader.CoordinationV1().Leases(kubeSystem).List(cx, metav1.ListOptions{LabelSelector: "multicluster.mcsannotations.io/relay-origin"})
	ok("the hub reader lists the relay Leases", err)
	_, err = hubReader.CoordinationV1().Leases(ns).List(cx, metav1.ListOptions{})
	forbidden("the hub reader lists Leases of another namespace", err)
	_, err = hubReader.CoreV1().Pods(ns).List(cx, metav1.ListOptions{})
	forbidden("the hub reader lists Pods", err)
	_, err = hubReader.CoreV1().Secrets(kubeSystem).List(cx, metav1.ListOptions{})
	forbidden("the hub reader lists Secrets", err)
	_, err = hubReader.CoordinationV1().Leases(kubeSystem).Patch(cx, "mcs-origin.edge-a", types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`), dryPatch)
	forbidden("the hub reader changes a Lease", err)

	// Without the binding, RBAC alone lets the Service with a selector in:
	// the policy is what stops it.
	if err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(cx, m.policyBinding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, func() error { return w.createService(withSelector) })
}

// refusedByPolicy tells whether err is the 403 of one of the policy's MCS
// controller rules (their messages name it; an expression that fails to
// evaluate would be refused too, under failurePolicy Fail, with another text).
func refusedByPolicy(err error, policy string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), policy) && strings.Contains(err.Error(), "the MCS controller")
}

// mcsWrites makes objects shaped as the MCS controller writes them, and
// writes them (dry run) as its identity.
type mcsWrites struct {
	t     *testing.T
	ns    string
	sa    *kubernetes.Clientset
	sadyn dynamic.Interface
	imp   *unstructured.Unstructured // the controller's ServiceImport, the owner
}

// derivedLike is a derived Service as the controller writes it: its labels
// and hash annotation, owned by the ServiceImport, selector-less ClusterIP.
func (w mcsWrites) derivedLike(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns,
			Labels:      map[string]string{labelAppManaged: mcsManagedBy, labelMCSService: "web"},
			Annotations: map[string]string{annotationHashed: "0123456789abcdef"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: w.imp.GetAPIVersion(), Kind: "ServiceImport",
				Name: w.imp.GetName(), UID: w.imp.GetUID()}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

func (w mcsWrites) createService(s *corev1.Service) error {
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := w.sa.CoreV1().Services(w.ns).Create(cx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// sliceLike is an EndpointSlice as the controller writes it for the MCS
// service web from cluster edge-b, feeding the Service svc ("": none, as
// for a headless import).
func (w mcsWrites) sliceLike(name, svc string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Labels: map[string]string{
			discoveryv1.LabelManagedBy: mcsManagedBy, labelMCSService: "web", "multicluster.kubernetes.io/source-cluster": "edge-b"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.2.0.10"}}},
	}
	if svc != "" {
		s.Labels[discoveryv1.LabelServiceName] = svc
	}
	return s
}
