package node

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// demoObjects are one cluster's sample workloads (the shape of
// manifests/examples, with the workload image): backend, a headless Service
// exported by annotation; web, a ClusterIP Service exported by a
// ServiceExport, which gets a ClusterSetIP.
func demoObjects(cluster string) string {
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
`, cluster, workloadYAML("backend-"+cluster, "backend", cluster), workloadYAML("web-"+cluster, "web", cluster))
}

// workloadYAML is WorkloadPod as YAML, for kubectl apply.
func workloadYAML(name, app, cluster string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: demo
  labels:
    app: %[2]s
spec:
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
        port: http`, name, app, cluster, WorkloadImage)
}

// TestClusterset: two real single-node clusters with routable Pod CIDRs,
// kubeadm's DNS add-on first, then the product installed as the README says
// (overlays edge-a and edge-b unmodified). A Pod in each cluster resolves
// through its own resolv.conf (kube-dns Service, kube-proxy, our CoreDNS Pod)
// the stock names and the clusterset names, and connects through the
// ClusterSetIP of web to the backends of both clusters.
func TestClusterset(t *testing.T) {
	tools := RequireTools(t)
	n := NewNetwork(t)
	a := StartCluster(t, n, tools, "edge-a")
	b := StartCluster(t, n, tools, "edge-b")
	cs := []*Cluster{a, b}
	for _, c := range cs {
		c.InstallStockDNS(t)
	}
	InstallClusterset(t, cs)
	for _, c := range cs {
		c.ApplyYAML(t, demoObjects(c.Name))
		c.WaitPodReady(t, "demo", "backend-"+c.Name)
		c.WaitPodReady(t, "demo", "web-"+c.Name)
		c.CreatePod(t, WorkloadPod("demo", "client", c.Name, nil))
	}
	backends := map[string]bool{}
	for _, c := range cs {
		backends[c.GetPodIP(t, "demo", "backend-"+c.Name)] = true
	}

	for _, c := range cs {
		t.Run(c.Name+"/stock names", func(t *testing.T) {
			if got := c.Lookup(t, "demo", "client", "kubernetes.default.svc.cluster.local"); !equal(got, "10.96.0.1") {
				t.Errorf("kubernetes.default.svc.cluster.local: %v, want [10.96.0.1]", got)
			}
			svc, err := c.Client.CoreV1().Services("demo").Get(context.Background(), "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Lookup(t, "demo", "client", "web"); !equal(got, svc.Spec.ClusterIP) {
				t.Errorf("web (search list: web.demo.svc.cluster.local): %v, want [%s]", got, svc.Spec.ClusterIP)
			}
		})
		t.Run(c.Name+"/clusterset names", func(t *testing.T) {
			// backend: headless, exported from both clusters: both Pod IPs.
			harness.Eventually(t, 2*time.Minute, func() error {
				got, err := c.LookupErr("demo", "client", "backend.demo.svc.clusterset.local")
				if err != nil {
					return err
				}
				if len(got) != len(backends) || !backends[got[0]] || !backends[got[len(got)-1]] {
					return fmt.Errorf("backend.demo.svc.clusterset.local: %v, want the backend Pods %v", got, keys(backends))
				}
				return nil
			})
		})
		t.Run(c.Name+"/ClusterSetIP carries traffic", func(t *testing.T) {
			ip := c.ClusterSetIP(t, "demo", "web")
			harness.Eventually(t, 2*time.Minute, func() error {
				got, err := c.LookupErr("demo", "client", "web.demo.svc.clusterset.local")
				if err != nil {
					return err
				}
				if !equal(got, ip) {
					return fmt.Errorf("web.demo.svc.clusterset.local: %v, want the ClusterSetIP [%s]", got, ip)
				}
				return nil
			})
			// Repeated connections through kube-proxy's rules for the
			// derived Service reach the web Pods of both clusters.
			seen := map[string]int{}
			for i := 0; i < 60 && len(seen) < len(cs); i++ {
				out, err := c.Exec("demo", "client", "/workload", "get", "http://web.demo.svc.clusterset.local/")
				if err != nil {
					t.Logf("attempt %d: %v", i, err)
					continue
				}
				seen[field(out, "cluster")]++
			}
			for _, o := range cs {
				if seen[o.Name] == 0 {
					t.Errorf("no answer from %s's web through the ClusterSetIP %s: %v", o.Name, ip, seen)
				}
			}
		})
	}
}

func equal(got []string, want ...string) bool {
	sort.Strings(got)
	sort.Strings(want)
	return strings.Join(got, ",") == strings.Join(want, ",")
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// field is the value of key=value in the workload's reply.
func field(out, key string) string {
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}
