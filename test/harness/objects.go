package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
)

// ReadManifests reads Kubernetes objects from YAML (or JSON) files, several
// documents per file allowed, in the order given and written. Empty
// documents (comments only) are skipped; a document without apiVersion or
// kind is an error that names the file and the document's position.
func ReadManifests(paths ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for doc := 1; ; doc++ {
			var m map[string]any
			err := dec.Decode(&m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
			}
			if len(m) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			if u.GetAPIVersion() == "" || u.GetKind() == "" {
				return nil, fmt.Errorf("%s: document %d: no apiVersion or kind", path, doc)
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// ReadManifestDir reads every *.yaml and *.yml file of a folder (not its
// subfolders), in name order, with ReadManifests.
func ReadManifestDir(dir string) ([]*unstructured.Unstructured, error) {
	var paths []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		paths = append(paths, m...)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml files", dir)
	}
	slices.Sort(paths)
	return ReadManifests(paths...)
}

// ObjectName is "Kind namespace/name" (or "Kind name" for a cluster-scoped
// object), for messages.
func ObjectName(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetKind() + " " + u.GetName()
	}
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// Dynamic returns a dynamic client of the cluster's API server (as admin).
func (c *Cluster) Dynamic(t T) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	return d
}

// CreateObjects creates objects of any kind the API server serves, in order,
// as admin, through the dynamic client (the kind's resource and scope come
// from the server's discovery). With dryRun, the server validates and admits
// each object (defaulting, schema, admission) without storing it. It returns
// the server's version of each object, or the first error, naming the object.
func (c *Cluster) CreateObjects(objs []*unstructured.Unstructured, dryRun bool) ([]*unstructured.Unstructured, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := restMapping(mapper, gvk)
		if err != nil {
			return out, fmt.Errorf("%s (%s): %w", ObjectName(u), gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ns := u.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		cx, cancel := ctx()
		got, err := ri.Create(cx, u, opts)
		cancel()
		if err != nil {
			return out, fmt.Errorf("create %s: %w", ObjectName(u), err)
		}
		out = append(out, got)
	}
	return out, nil
}

// ToTyped converts an object read by ReadManifests into a typed API object
// (for example a *corev1.Pod), rejecting fields the type does not have.
func ToTyped(u *unstructured.Unstructured, into any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		return fmt.Errorf("%s: %w", ObjectName(u), err)
	}
	return nil
}

// CreatePodObject creates a Pod as written (for example read from YAML),
// bound to FakeNode when spec.nodeName is empty (there is no scheduler).
// The status is not written on create: set it with SetPodStatus.
func (c *Cluster) CreatePodObject(t T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	p := pod.DeepCopy()
	if p.Spec.NodeName == "" {
		p.Spec.NodeName = FakeNode
	}
	p.Status = corev1.PodStatus{}
	cx, cancel := ctx()
	defer cancel()
	out, err := c.Client.CoreV1().Pods(p.Namespace).Create(cx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("harness: cluster %s: create pod %s/%s: %v", c.Name, p.Namespace, p.Name, err)
	}
	return out
}

// KubeconfigAs writes a kubeconfig that authenticates as admin but acts as
// user with groups (impersonation: the API server authorizes every request
// as that user, exactly as if it had authenticated with its own token), and
// returns its path. For a service account, user is
// "system:serviceaccount:NS:NAME" and groups should hold
// "system:serviceaccounts", "system:serviceaccounts:NS" and
// "system:authenticated", the groups its token would carry.
func (c *Cluster) KubeconfigAs(t T, user string, groups ...string) string {
	t.Helper()
	safe := nsUnsafe.ReplaceAllString(strings.ToLower(user), "-")
	path := filepath.Join(c.Dir, "kubeconfig-as-"+strings.Trim(safe, "-"))
	if err := writeKubeconfig(path, c.Name, c.Server(), c.Token, user, groups); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return path
}

// ClientAs returns a clientset that acts as user with groups (see KubeconfigAs).
func (c *Cluster) ClientAs(t T, user string, groups ...string) *kubernetes.Clientset {
	t.Helper()
	return NewClient(t, c.KubeconfigAs(t, user, groups...), 0)
}

// ServiceAccountGroups are the groups a service account's token carries.
func ServiceAccountGroups(namespace string) []string {
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
}

// ServiceAccountUser is the user name of a service account.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// quoteList renders a YAML flow list of quoted strings.
func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// restMappingWait bounds how long a kind may be missing from discovery: the
// API server serves a CRD just created a moment before its discovery
// document lists it.
const restMappingWait = 10 * time.Second

// restMapping maps gvk, asking discovery again while the kind is unknown,
// for at most restMappingWait.
func restMapping(mapper *restmapper.DeferredDiscoveryRESTMapper, gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	deadline := time.Now().Add(restMappingWait)
	for {
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil || !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return m, err
		}
		time.Sleep(200 * time.Millisecond)
		mapper.Reset()
	}
}
