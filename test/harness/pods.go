package harness

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The MCS wire format on Pods (docs/DESIGN.md#wire-format). Written out here,
// not imported from the plugin, so that the tests check the plugin against the
// contract.
const (
	ExporterLabel    = "multicluster.kubernetes.io/exporter"
	ImporterLabel    = "multicluster.kubernetes.io/importer"
	ExportAnnotation = "multicluster.kubernetes.io/export-services"
	ImportAnnotation = "multicluster.kubernetes.io/import-services"
)

// FakeNode is the node Pods are bound to by default. No Node object and no
// kubelet exist: the test sets the Pods' status itself.
const FakeNode = "fake-node"

// ExportPort is one port of an exported service in the export annotation.
type ExportPort struct {
	Name       string `json:"name,omitempty"`
	Port       int32  `json:"port"`
	TargetPort int32  `json:"targetPort,omitempty"`
	Protocol   string `json:"protocol,omitempty"`
}

// ExportService is one entry of the export annotation. Empty Namespace and
// Cluster are left out (they default to the Pod's namespace and the source
// cluster).
type ExportService struct {
	Name      string       `json:"name"`
	Namespace string       `json:"namespace,omitempty"`
	Cluster   string       `json:"cluster,omitempty"`
	Ports     []ExportPort `json:"ports,omitempty"`
	// Allowed are the other namespaces the exporter lets resolve the
	// service under imports enforce (annotation.Export.Allowed).
	Allowed []string `json:"allowedNamespaces,omitempty"`
}

// ExportJSON is the value of the export annotation for these services.
func ExportJSON(svcs ...ExportService) string {
	b, err := json.Marshal(struct {
		Services []ExportService `json:"services"`
	}{svcs})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Pod describes a Pod to create.
type Pod struct {
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	Hostname    string // spec.hostname; empty for none
	NodeName    string // default FakeNode
}

// ExporterPod is a Pod with the exporter label and an export annotation for svcs.
func ExporterPod(name, hostname string, svcs ...ExportService) Pod {
	return Pod{
		Name:        name,
		Hostname:    hostname,
		Labels:      map[string]string{ExporterLabel: "true"},
		Annotations: map[string]string{ExportAnnotation: ExportJSON(svcs...)},
	}
}

// PodStatus is what the harness, acting as the kubelet, writes into a Pod's status.
type PodStatus struct {
	Phase corev1.PodPhase // default Running
	// IPs are podIPs (IPv4 and/or IPv6, at most one of each); the first is
	// podIP. When empty, the Pod's IPs are left as they are.
	IPs   []string
	Ready bool // the Ready (and ContainersReady) condition
}

var nsUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// NewNamespace creates a namespace with a fresh name made from the test's
// name, and returns the name. (Nothing deletes namespaces here: with no
// controllers a deleted namespace stays Terminating, so every test takes a
// new one.)
func (c *Cluster) NewNamespace(t T) string {
	t.Helper()
	base := nsUnsafe.ReplaceAllString(strings.ToLower(t.Name()), "-")
	base = strings.Trim(base, "-")
	if len(base) > 40 {
		base = strings.Trim(base[len(base)-40:], "-")
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	name := strings.TrimPrefix(base+"-"+hex.EncodeToString(suffix), "-")
	c.CreateNamespace(t, name)
	return name
}

// CreateNamespace creates a namespace.
func (c *Cluster) CreateNamespace(t T, name string) {
	t.Helper()
	cx, cancel := ctx()
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Client.CoreV1().Namespaces().Create(cx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("harness: cluster %s: create namespace %s: %v", c.Name, name, err)
	}
}

func (p Pod) object(ns string) *corev1.Pod {
	node := p.NodeName
	if node == "" {
		node = FakeNode
	}
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns, Labels: p.Labels, Annotations: p.Annotations},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Hostname:                      p.Hostname,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "registry.invalid/app:never-pulled",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
}

// CreatePod creates a Pod bound to its node (Pending, no IP until SetPodStatus).
func (c *Cluster) CreatePod(t T, ns string, p Pod) *corev1.Pod {
	t.Helper()
	out, err := c.createPod(ns, p)
	if err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	return out
}

func (c *Cluster) createPod(ns string, p Pod) (*corev1.Pod, error) {
	cx, cancel := ctx()
	defer cancel()
	out, err := c.Client.CoreV1().Pods(ns).Create(cx, p.object(ns), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", ns, p.Name, err)
	}
	return out, nil
}

// ReadyPod is a Pod to create and make Running and Ready with IPs.
type ReadyPod struct {
	Pod
	IPs []string
}

// CreateReadyPods creates Pods and makes each Running and Ready with its IPs,
// eight at a time.
func (c *Cluster) CreateReadyPods(t T, ns string, pods ...ReadyPod) {
	t.Helper()
	const workers = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan ReadyPod)
	)
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				_, err := c.createPod(ns, p.Pod)
				if err == nil {
					err = c.setPodStatus(ns, p.Name, PodStatus{IPs: p.IPs, Ready: true})
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, p := range pods {
		next <- p
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("harness: cluster %s: %d of %d Pods failed, first: %v", c.Name, len(errs), len(pods), errs[0])
	}
}

// SetPodStatus acts as the kubelet: a merge patch of the status subresource
// with the phase, podIP/podIPs and the Ready and ContainersReady conditions.
func (c *Cluster) SetPodStatus(t T, ns, name string, st PodStatus) {
	t.Helper()
	if err := c.setPodStatus(ns, name, st); err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
}

// SetPodReady makes a Pod Running and Ready (ready=true) or Running and not
// Ready, with these IPs (unchanged when none are given).
func (c *Cluster) SetPodReady(t T, ns, name string, ready bool, ips ...string) {
	t.Helper()
	c.SetPodStatus(t, ns, name, PodStatus{IPs: ips, Ready: ready})
}

func (c *Cluster) setPodStatus(ns, name string, st PodStatus) error {
	phase := st.Phase
	if phase == "" {
		phase = corev1.PodRunning
	}
	cond := corev1.ConditionFalse
	if st.Ready {
		cond = corev1.ConditionTrue
	}
	now := metav1.NewTime(time.Now())
	status := map[string]any{
		"phase":  phase,
		"hostIP": Loopback,
		"hostIPs": []map[string]string{
			{"ip": Loopback},
		},
		"startTime": now,
		"conditions": []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: cond, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: cond, LastTransitionTime: now},
		},
	}
	if len(st.IPs) > 0 {
		ips := make([]map[string]string, len(st.IPs))
		for i, ip := range st.IPs {
			ips[i] = map[string]string{"ip": ip}
		}
		status["podIP"] = st.IPs[0]
		status["podIPs"] = ips
	}
	b, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	if _, err := c.Client.CoreV1().Pods(ns).Patch(cx, name, types.MergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch status of pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// GetPod reads a Pod.
func (c *Cluster) GetPod(t T, ns, name string) *corev1.Pod {
	t.Helper()
	cx, cancel := ctx()
	defer cancel()
	p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("harness: cluster %s: get pod %s/%s: %v", c.Name, ns, name, err)
	}
	return p
}

// DeletePod deletes a Pod at once (gracePeriodSeconds=0: with no kubelet, a
// graceful delete of a bound Pod would only set deletionTimestamp) and waits
// until it is gone.
func (c *Cluster) DeletePod(t T, ns, name string) {
	t.Helper()
	cx, cancel := ctx()
	defer cancel()
	zero := int64(0)
	err := c.Client.CoreV1().Pods(ns).Delete(cx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("harness: cluster %s: delete pod %s/%s: %v", c.Name, ns, name, err)
	}
	deadline := time.Now().Add(clientTimeout)
	for time.Now().Before(deadline) {
		_, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("harness: cluster %s: pod %s/%s still there %s after delete", c.Name, ns, name, clientTimeout)
}

// PatchPodMetadata merge-patches a Pod's annotations and labels: a nil value
// removes the key, absent keys are left alone.
func (c *Cluster) PatchPodMetadata(t T, ns, name string, annotations, labels map[string]*string) {
	t.Helper()
	meta := map[string]any{}
	if annotations != nil {
		meta["annotations"] = annotations
	}
	if labels != nil {
		meta["labels"] = labels
	}
	b, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	cx, cancel := ctx()
	defer cancel()
	if _, err := c.Client.CoreV1().Pods(ns).Patch(cx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatalf("harness: cluster %s: patch metadata of pod %s/%s: %v", c.Name, ns, name, err)
	}
}

// SetPodAnnotation sets one annotation of a Pod.
func (c *Cluster) SetPodAnnotation(t T, ns, name, key, value string) {
	t.Helper()
	c.PatchPodMetadata(t, ns, name, map[string]*string{key: &value}, nil)
}

// RemovePodAnnotation removes one annotation of a Pod.
func (c *Cluster) RemovePodAnnotation(t T, ns, name, key string) {
	t.Helper()
	c.PatchPodMetadata(t, ns, name, map[string]*string{key: nil}, nil)
}
