package harness

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ImportService is one entry of the import annotation
// (docs/DESIGN.md#wire-format). Empty Namespace, Cluster and Alias are left
// out (the namespace defaults to the Pod's; no cluster means any cluster).
type ImportService struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Cluster   string `json:"cluster,omitempty"`
	Alias     string `json:"alias,omitempty"`
}

// ImportJSON is the value of the import annotation for these services.
func ImportJSON(svcs ...ImportService) string {
	b, err := json.Marshal(struct {
		Services []ImportService `json:"services"`
	}{svcs})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// ImporterPod is a Pod with the importer label and, when svcs are given, an
// import annotation for them (none: the label alone, no imports).
func ImporterPod(name string, svcs ...ImportService) Pod {
	p := Pod{Name: name, Labels: map[string]string{ImporterLabel: "true"}, Annotations: map[string]string{}}
	if len(svcs) > 0 {
		p.Annotations[ImportAnnotation] = ImportJSON(svcs...)
	}
	return p
}

// CreateClusterIPService creates a ClusterIP Service with one TCP port (80)
// and returns the ClusterIP the API server allocated (it does so itself; no
// controller is needed).
func (c *Cluster) CreateClusterIPService(t T, ns, name string) string {
	t.Helper()
	cx, cancel := ctx()
	defer cancel()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	out, err := c.Client.CoreV1().Services(ns).Create(cx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("harness: cluster %s: create service %s/%s: %v", c.Name, ns, name, err)
	}
	if out.Spec.ClusterIP == "" || out.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Fatalf("harness: cluster %s: service %s/%s has no ClusterIP (%q)", c.Name, ns, name, out.Spec.ClusterIP)
	}
	return out.Spec.ClusterIP
}

// Object is the Pod object that CreatePod would create in ns, to change
// before creating it with CreatePodObject (for example spec.hostNetwork).
func (p Pod) Object(ns string) *corev1.Pod { return p.object(ns) }
