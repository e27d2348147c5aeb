package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/mcs-api/config/crd"
)

// ServiceExportAnnotation on a Service asks the annotator to export it (value "true").
const ServiceExportAnnotation = "multicluster.kubernetes.io/export"

// MCSGroup is the API group of the MCS CRDs (ServiceExport, ServiceImport).
const MCSGroup = "multicluster.x-k8s.io"

// ServiceExportResource is the ServiceExport resource of version (v1alpha1 or v1beta1).
func ServiceExportResource(version string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: MCSGroup, Version: version, Resource: "serviceexports"}
}

// ServiceObject is a ClusterIP Service (type set when typ is not empty) with
// this selector and these ports, to change before CreateService.
func ServiceObject(ns, name string, selector map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selector,
			Ports:    ports,
		},
	}
}

// CreateService creates a Service as written and returns the server's copy.
func (c *Cluster) CreateService(t T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	cx, cancel := ctx()
	defer cancel()
	out, err := c.Client.CoreV1().Services(svc.Namespace).Create(cx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("harness: cluster %s: create service %s/%s: %v", c.Name, svc.Namespace, svc.Name, err)
	}
	return out
}

// PatchServiceAnnotations merge-patches a Service's annotations: a nil value
// removes the key, absent keys are left alone.
func (c *Cluster) PatchServiceAnnotations(t T, ns, name string, annotations map[string]*string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	cx, cancel := ctx()
	defer cancel()
	if _, err := c.Client.CoreV1().Services(ns).Patch(cx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatalf("harness: cluster %s: patch annotations of service %s/%s: %v", c.Name, ns, name, err)
	}
}

// DeleteService deletes a Service.
func (c *Cluster) DeleteService(t T, ns, name string) {
	t.Helper()
	cx, cancel := ctx()
	defer cancel()
	if err := c.Client.CoreV1().Services(ns).Delete(cx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("harness: cluster %s: delete service %s/%s: %v", c.Name, ns, name, err)
	}
}

// InstallMCSCRDs creates the ServiceExport and ServiceImport CRDs of the
// sigs.k8s.io/mcs-api module (embedded in its config/crd package: they come
// from the module cache, not from a copy; both serve v1alpha1 and v1beta1)
// and waits (30 s at most) until ServiceExports of both versions and
// ServiceImports can be listed.
func (c *Cluster) InstallMCSCRDs(t T) {
	t.Helper()
	dir := TempDir(t)
	var paths []string
	for _, f := range []struct {
		name string
		b    []byte
	}{{"serviceexports.yaml", crd.ServiceExportCRD}, {"serviceimports.yaml", crd.ServiceImportCRD}} {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.b, 0o644); err != nil {
			t.Fatalf("harness: %v", err)
		}
		paths = append(paths, p)
	}
	objs, err := ReadManifests(paths...)
	if err != nil {
		t.Fatalf("harness: mcs-api CRDs: %v", err)
	}
	if _, err := c.CreateObjects(objs, false); err != nil {
		t.Fatalf("harness: cluster %s: mcs-api CRDs: %v", c.Name, err)
	}
	dyn := c.Dynamic(t)
	deadline := time.Now().Add(30 * time.Second)
	imports := schema.GroupVersionResource{Group: MCSGroup, Version: "v1alpha1", Resource: "serviceimports"}
	for _, gvr := range []schema.GroupVersionResource{ServiceExportResource("v1alpha1"), ServiceExportResource("v1beta1"), imports} {
		for {
			cx, cancel := ctx()
			_, err := dyn.Resource(gvr).Namespace(metav1.NamespaceDefault).List(cx, metav1.ListOptions{Limit: 1})
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("harness: cluster %s: %s not served 30 s after creating the CRDs: %v", c.Name, gvr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// CreateServiceExport creates the ServiceExport ns/name in API version
// version (v1alpha1 or v1beta1; the CRD has no conversion webhook, so both
// name the same object).
func (c *Cluster) CreateServiceExport(t T, version, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(MCSGroup + "/" + version)
	u.SetKind("ServiceExport")
	u.SetNamespace(ns)
	u.SetName(name)
	cx, cancel := ctx()
	defer cancel()
	out, err := c.Dynamic(t).Resource(ServiceExportResource(version)).Namespace(ns).Create(cx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("harness: cluster %s: create ServiceExport %s %s/%s: %v", c.Name, version, ns, name, err)
	}
	return out
}

// DeleteServiceExport deletes the ServiceExport ns/name (no finalizers are
// expected: nothing here would remove them) and waits until it is gone.
func (c *Cluster) DeleteServiceExport(t T, ns, name string) {
	t.Helper()
	ri := c.Dynamic(t).Resource(ServiceExportResource("v1beta1")).Namespace(ns)
	cx, cancel := ctx()
	defer cancel()
	if err := ri.Delete(cx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("harness: cluster %s: delete ServiceExport %s/%s: %v", c.Name, ns, name, err)
	}
	deadline := time.Now().Add(clientTimeout)
	for time.Now().Before(deadline) {
		u, err := ri.Get(cx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if err == nil && len(u.GetFinalizers()) > 0 {
			t.Fatalf("harness: cluster %s: ServiceExport %s/%s has finalizers %v", c.Name, ns, name, u.GetFinalizers())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("harness: cluster %s: ServiceExport %s/%s still there %s after delete", c.Name, ns, name, clientTimeout)
}

// ServiceExportStatus reads the ServiceExport ns/name (as v1beta1) and
// returns its metadata.generation and status.conditions.
func (c *Cluster) ServiceExportStatus(ns, name string) (int64, []metav1.Condition, error) {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return 0, nil, err
	}
	cx, cancel := ctx()
	defer cancel()
	u, err := dyn.Resource(ServiceExportResource("v1beta1")).Namespace(ns).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		return 0, nil, fmt.Errorf("get ServiceExport %s/%s: %w", ns, name, err)
	}
	raw, _, err := unstructured.NestedSlice(u.Object, "status", "conditions")
	if err != nil {
		return 0, nil, fmt.Errorf("ServiceExport %s/%s: status.conditions: %w", ns, name, err)
	}
	conds := make([]metav1.Condition, 0, len(raw))
	for i, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return 0, nil, fmt.Errorf("ServiceExport %s/%s: status.conditions[%d] is %T", ns, name, i, r)
		}
		var cond metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &cond); err != nil {
			return 0, nil, fmt.Errorf("ServiceExport %s/%s: status.conditions[%d]: %w", ns, name, i, err)
		}
		conds = append(conds, cond)
	}
	return u.GetGeneration(), conds, nil
}
