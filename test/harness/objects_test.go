package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const manifestYAML = `# a comment-only document is skipped
---
apiVersion: v1
kind: Namespace
metadata:
  name: objects
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: objects
  labels:
    multicluster.kubernetes.io/exporter: "true"
  annotations:
    multicluster.kubernetes.io/export-services: '{"services":[{"name":"web"}]}'
spec:
  hostname: web-0
  containers:
  - name: app
    image: registry.invalid/app:1
status:
  podIPs:
  - ip: 10.9.0.1
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: objects-pod-reader
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
`

// TestReadManifests needs no cluster: documents, order, typed conversion,
// and the errors that name the file.
func TestReadManifests(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	objs, err := ReadManifests(write("a.yaml", manifestYAML))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range objs {
		names = append(names, ObjectName(u))
	}
	if got, want := strings.Join(names, ", "), "Namespace objects, Pod objects/web-0, ClusterRole objects-pod-reader"; got != want {
		t.Errorf("objects:\n got %s\nwant %s", got, want)
	}
	var pod corev1.Pod
	if err := ToTyped(objs[1], &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Spec.Hostname != "web-0" || len(pod.Status.PodIPs) != 1 || pod.Status.PodIPs[0].IP != "10.9.0.1" || pod.Labels[ExporterLabel] != "true" {
		t.Errorf("typed pod: %+v", pod)
	}

	if _, err := ReadManifests(write("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [\n")); err == nil || !strings.Contains(err.Error(), "bad.yaml: document 1") {
		t.Errorf("broken YAML: err %v", err)
	}
	if _, err := ReadManifests(write("nokind.yaml", "---\nmetadata: {name: x}\n")); err == nil || !strings.Contains(err.Error(), "no apiVersion or kind") {
		t.Errorf("no kind: err %v", err)
	}
	var wrong corev1.Pod
	if err := ToTyped(objs[2], &wrong); err == nil {
		t.Errorf("a ClusterRole converted into a Pod without error")
	}
	write("b.yml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: second}\n")
	if err := os.Remove(filepath.Join(dir, "bad.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "nokind.yaml")); err != nil {
		t.Fatal(err)
	}
	if objs, err := ReadManifestDir(dir); err != nil || len(objs) != 4 || objs[3].GetName() != "second" {
		t.Errorf("ReadManifestDir: %d objects, err %v", len(objs), err)
	}
}

// TestObjects creates manifests in a real cluster (dry run, then for real),
// a Pod from YAML, and checks that impersonation is authorized as the
// impersonated user.
func TestObjects(t *testing.T) {
	c := StartCluster(t, "objects")
	path := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(path, []byte(manifestYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := ReadManifests(path)
	if err != nil {
		t.Fatal(err)
	}
	// Dry run: the namespace is not stored, so the Pod in it is refused.
	if _, err := c.CreateObjects(objs[:1], true); err != nil {
		t.Fatalf("dry run: %v", err)
	}
	cx, cancel := ctx()
	defer cancel()
	if _, err := c.Client.CoreV1().Namespaces().Get(cx, "objects", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace after a dry run: err %v, want NotFound", err)
	}
	if _, err := c.CreateObjects(objs[:2], true); err == nil || !strings.Contains(err.Error(), "Pod objects/web-0") {
		t.Errorf("dry run of a Pod in a missing namespace: err %v", err)
	}

	// For real: the namespace and the role; the Pod through the typed client.
	got, err := c.CreateObjects([]*unstructured.Unstructured{objs[0], objs[2]}, false)
	if err != nil || len(got) != 2 || got[1].GetUID() == "" {
		t.Fatalf("create: %d objects, err %v", len(got), err)
	}
	var pod corev1.Pod
	if err := ToTyped(objs[1], &pod); err != nil {
		t.Fatal(err)
	}
	created := c.CreatePodObject(t, &pod)
	if created.Spec.NodeName != FakeNode || created.Status.PodIP != "" {
		t.Errorf("created pod: node %q podIP %q", created.Spec.NodeName, created.Status.PodIP)
	}
	c.SetPodReady(t, "objects", "web-0", true, "10.9.0.1")
	if p := c.GetPod(t, "objects", "web-0"); p.Status.PodIP != "10.9.0.1" || !podReady(p) {
		t.Errorf("pod status: %+v", p.Status)
	}

	// Impersonation: a service account with no binding is refused, and is
	// allowed once bound to the role.
	sa := ServiceAccountUser("objects", "reader")
	as := c.ClientAs(t, sa, ServiceAccountGroups("objects")...)
	if _, err := as.CoreV1().Pods("objects").List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list pods as %s before the binding: err %v, want Forbidden", sa, err)
	}
	binding := strings.NewReplacer("\t", "  ").Replace(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
	name: objects-pod-reader
roleRef:
	apiGroup: rbac.authorization.k8s.io
	kind: ClusterRole
	name: objects-pod-reader
subjects:
- kind: ServiceAccount
	name: reader
	namespace: objects
`)
	if err := os.WriteFile(path, []byte(binding), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err = ReadManifests(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateObjects(objs, false); err != nil {
		t.Fatal(err)
	}
	Eventually(t, clientTimeout, func() error {
		_, err := as.CoreV1().Pods("objects").List(cx, metav1.ListOptions{})
		return err
	})
	if _, err := as.CoreV1().Pods("objects").Create(cx, pod.DeepCopy(), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a pod as %s: err %v, want Forbidden", sa, err)
	}
}
