package node

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// stockDNSPath is testdata/kubeadm-coredns.yaml, from the repository root
// (a program such as ./up runs from anywhere in it).
func stockDNSPath() string {
	root, _ := harness.RepoRoot()
	return filepath.Join(root, "test", "node", "testdata", "kubeadm-coredns.yaml")
}

// InstallStockDNS applies kubeadm's DNS add-on (testdata/kubeadm-coredns.yaml)
// and waits until the coredns Deployment has a ready replica.
func (c *Cluster) InstallStockDNS(t harness.T) {
	t.Helper()
	if out, err := c.Kubectl(time.Minute, "apply", "-f", stockDNSPath()); err != nil {
		t.Fatalf("node %s: %v\n%s", c.Name, err, out)
	}
	c.WaitDeployment(t, "kube-system", "coredns")
}

// Lookup resolves name inside a Pod with the workload's resolver (the Pod's
// resolv.conf); it fails the test when the lookup fails.
func (c *Cluster) Lookup(t harness.T, ns, pod, name string) []string {
	t.Helper()
	out, err := c.Exec(ns, pod, "/workload", "lookup", name)
	if err != nil {
		t.Fatalf("node %s: lookup %s in Pod %s/%s: %v", c.Name, name, ns, pod, err)
	}
	return strings.Fields(out)
}

// LookupErr is Lookup, returning the error.
func (c *Cluster) LookupErr(ns, pod, name string) ([]string, error) {
	out, err := c.Exec(ns, pod, "/workload", "lookup", name)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// DemoObjects are one cluster's sample workloads (the shape of
// manifests/examples, with the workload image): backend, a headless Service
// exported by annotation, which Pods of namespace other may resolve as well
// (allowed-namespaces); web, a ClusterIP Service exported by a
// ServiceExport, which gets a ClusterSetIP.
func DemoObjects(cluster string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: demo
---
apiVersion: v1
kind: Service
metadata:
  name: backend
  namespace: demo
  annotations:
    multicluster.kubernetes.io/export: "true"
    # Under imports enforce, Pods of namespace other may resolve it too.
    multicluster.kubernetes.io/allowed-namespaces: other
spec:
  clusterIP: None
  selector:
    app: backend
  ports:
  - name: http
    port: 80
    targetPort: http
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata:
  name: web
  namespace: demo
---
%[2]s
---
%[3]s
`, cluster, workloadYAML("demo", "backend-"+cluster, "backend", cluster), workloadYAML("demo", "web-"+cluster, "web", cluster))
}

// InstallDemo applies DemoObjects and adds Pod demo/client (WorkloadPod),
// and waits until the backend, web and client Pods are ready.
func (c *Cluster) InstallDemo(t harness.T) {
	t.Helper()
	c.ApplyYAML(t, DemoObjects(c.Name))
	c.WaitPodReady(t, "demo", "backend-"+c.Name)
	c.WaitPodReady(t, "demo", "web-"+c.Name)
	c.CreatePod(t, WorkloadPod("demo", "client", c.Name, nil))
}

// workloadYAML is WorkloadPod as YAML, for kubectl apply.
func workloadYAML(ns, name, app, cluster string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: %[5]s
  labels:
    app: %[2]s
spec:
  hostname: %[1]s
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: %[4]s
    imagePullPolicy: Never
    env:
    - name: CLUSTER
      value: %[3]s
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      periodSeconds: 1
      httpGet:
        path: /
        port: http`, name, app, cluster, WorkloadImage, ns)
}
