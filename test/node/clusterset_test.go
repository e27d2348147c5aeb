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

// maxSwitchFailures bounds the lookups a Pod may lose while the stock add-on
// is replaced by ours. Not zero, for a reason in kubeadm's Pods, which the
// switch cannot change: their readiness probe (every 10 s, three failures)
// keeps each of them serving through its 5 s lameduck until it exits, so
// kube-proxy deletes the UDP conntrack entries that lead to it only after
// the exit. A query sent in between from a source port that an earlier
// query to that Pod used (one entry per query of the last 30 s) follows its
// entry to the Pod that is gone, and is lost: the lookup times out. Our
// Pods leave serving before they exit (manifests/coredns/deployment.yaml):
// the rollback to the stock add-on (testRollback) loses none. Each of
// kubeadm's two Pods can cost a lookup or two, so the bound is four.
const maxSwitchFailures = 4

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
	// The switch from the stock add-on to ours, as a Pod sees it: a Pod in
	// each cluster resolves kubernetes.default every 100 ms from before
	// the overlay is applied until well after our CoreDNS serves.
	probes := make([]<-chan string, len(cs))
	eps := make([]*EndpointLog, len(cs))
	for i, c := range cs {
		c.InstallStockDNS(t)
		c.CreatePod(t, WorkloadPod("default", "prober", c.Name, nil))
		// kubeadm's DNS add-on, running our image with kubeadm's Corefile,
		// serves the Pod's own resolver (kubelet-written resolv.conf:
		// nameserver 10.96.0.10, search list, ndots 5) the kubernetes
		// Service by its short and full names.
		for _, name := range []string{"kubernetes.default.svc.cluster.local", "kubernetes.default", "kubernetes"} {
			if got := c.Lookup(t, "default", "prober", name); !equal(got, "10.96.0.1") {
				t.Errorf("%s: lookup %s with the stock add-on: %v, want [10.96.0.1]", c.Name, name, got)
			}
		}
		eps[i] = c.WatchDNSEndpoints()
		probes[i] = c.StartProbe("default", "prober", "kubernetes.default.svc.cluster.local", 150*time.Second)
	}
	InstallClusterset(t, cs)
	for _, c := range cs {
		c.InstallDemo(t)
	}
	backends := map[string]string{}
	for _, c := range cs {
		backends[c.Name] = c.GetPodIP(t, "demo", "backend-"+c.Name)
	}

	for i, c := range cs {
		t.Run(c.Name+"/switch from the stock add-on loses no cluster.local answer", func(t *testing.T) {
			// At most maxSwitchFailures lost (see there); each failure is
			// logged beside the kube-dns endpoints' states over time and
			// kube-proxy's conntrack clean-ups, which show the step of the
			// rollout it fell in.
			out := <-probes[i]
			eps[i].Stop()
			ok, fail, err := ParseProbe(out)
			if err != nil || ok == 0 || fail > maxSwitchFailures {
				t.Errorf("kubernetes.default.svc.cluster.local every 100 ms across the switch: %s\nkube-dns endpoints:\n%s\nkube-proxy:\n%s",
					out, eps[i], c.ConntrackCleanups())
			} else {
				t.Logf("kubernetes.default.svc.cluster.local every 100 ms across the switch: %s\nkube-dns endpoints:\n%s\nkube-proxy:\n%s",
					out, eps[i], c.ConntrackCleanups())
			}
		})
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
			// backend: headless, exported from both clusters. The service
			// name answers with the local cluster's ready Pods (locality
			// prefer-local, the default); each Pod's own name
			// <hostname>.<cluster>.backend... answers in every cluster, and
			// leads to that Pod across the flat Pod network.
			want := map[string]string{"backend.demo.svc.clusterset.local": backends[c.Name]}
			for _, o := range cs {
				want["backend-"+o.Name+"."+o.Name+".backend.demo.svc.clusterset.local"] = backends[o.Name]
			}
			for name, ip := range want {
				harness.Eventually(t, 2*time.Minute, func() error {
					got, err := c.LookupErr("demo", "client", name)
					if err != nil {
						return err
					}
					if !equal(got, ip) {
						return fmt.Errorf("%s: %v, want [%s]", name, got, ip)
					}
					return nil
				})
			}
			for _, o := range cs {
				name := "backend-" + o.Name + "." + o.Name + ".backend.demo.svc.clusterset.local"
				out, err := c.Exec("demo", "client", "/workload", "get", "http://"+name+":8080/")
				if err != nil {
					t.Errorf("GET %s from %s: %v", name, c.Name, err)
					continue
				}
				if got := field(out, "pod"); got != "backend-"+o.Name {
					t.Errorf("GET %s from %s: %q, want pod=backend-%s", name, c.Name, out, o.Name)
				}
				// No SNAT between the clusters: the backend sees the
				// client Pod's own IP.
				if got, want := field(out, "remote"), c.GetPodIP(t, "demo", "client"); !strings.HasPrefix(got, want+":") {
					t.Errorf("GET %s from %s: the backend saw %s, want the client Pod's IP %s", name, c.Name, got, want)
				}
			}
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

	// An importing Pod's alias name: the import annotation of Pod importer
	// names web "shop"; its own resolver's search list asks
	// shop.demo.svc.cluster.local, which the plugin answers as web's name
	// because it knows the query's source, the Pod's own IP, through the
	// kube-dns Service (no SNAT on the way). Another Pod asking the same
	// name gets no answer.
	t.Run("alias name of an importing Pod", func(t *testing.T) {
		imp := WorkloadPod("demo", "importer", a.Name, map[string]string{harness.ImporterLabel: "true"})
		imp.Annotations = map[string]string{harness.ImportAnnotation: harness.ImportJSON(harness.ImportService{Name: "web", Alias: "shop"})}
		a.CreatePod(t, imp)
		ip := a.ClusterSetIP(t, "demo", "web")
		harness.Eventually(t, 2*time.Minute, func() error {
			got, err := a.LookupErr("demo", "importer", "shop")
			if err != nil {
				return err
			}
			if !equal(got, ip) {
				return fmt.Errorf("shop from the importing Pod: %v, want web's ClusterSetIP [%s]", got, ip)
			}
			return nil
		})
		if out, err := a.Exec("demo", "importer", "/workload", "get", "http://shop/"); err != nil || field(out, "cluster") == "" {
			t.Errorf("GET http://shop/ from the importing Pod: %q %v", out, err)
		}
		if got, err := a.LookupErr("demo", "client", "shop"); err == nil {
			t.Errorf("shop from Pod client, which imports nothing: %v, want no answer", got)
		}
	})

	// Partition: edge-a cut from edge-b (nodes and Pod networks; each keeps
	// its own API server), then edge-a's CoreDNS Pod deleted: the kubelet
	// starts a new one on the same node, which serves edge-b's names from the
	// hostPath snapshot although edge-b is unreachable, and the ClusterSetIP
	// still leads to edge-a's own backend; then edge-a's API server stopped
	// as well, and started again.
	t.Run("partition and CoreDNS restart", func(t *testing.T) {
		n.Cut(t, a.Name, b.Name)
		defer n.Restore(t, a.Name, b.Name)
		if out, err := a.Kubectl(time.Minute, "-n", "kube-system", "delete", "pod", "-l", "app.kubernetes.io/name=coredns-mcsannotations", "--wait=true"); err != nil {
			t.Fatalf("delete CoreDNS Pod: %v\n%s", err, out)
		}
		a.WaitRollout(t, "kube-system", "coredns")
		name := "backend-edge-b.edge-b.backend.demo.svc.clusterset.local"
		harness.Eventually(t, 2*time.Minute, func() error {
			got, err := a.LookupErr("demo", "client", name)
			if err != nil {
				return err
			}
			if !equal(got, backends[b.Name]) {
				return fmt.Errorf("%s during the partition: %v, want [%s]", name, got, backends[b.Name])
			}
			return nil
		})
		if got := a.Lookup(t, "demo", "client", "kubernetes.default.svc.cluster.local"); !equal(got, "10.96.0.1") {
			t.Errorf("kubernetes.default.svc.cluster.local during the partition: %v", got)
		}
		// Only edge-a's web answers through the ClusterSetIP now: edge-b's
		// endpoints are unreachable (their slices stay: the controller keeps
		// a cut peer's share), so some connections fail; none reaches edge-b.
		seen := map[string]int{}
		for i := 0; i < 20; i++ {
			out, err := a.Exec("demo", "client", "/workload", "get", "http://web.demo.svc.clusterset.local/")
			if err == nil {
				seen[field(out, "cluster")]++
			}
		}
		if seen[a.Name] == 0 || seen[b.Name] != 0 {
			t.Errorf("through the ClusterSetIP during the partition: %v, want edge-a's web only", seen)
		}

		// edge-a's API server down too: CoreDNS answers from what it holds,
		// kube-proxy keeps its rules. Asked from the node's namespace
		// (kubectl exec needs the API server), through the kube-dns Service.
		ip := a.ClusterSetIP(t, "demo", "web")
		a.StopAPIServer(t)
		for name, want := range map[string]string{name: backends[b.Name], "kubernetes.default.svc.cluster.local": "10.96.0.1"} {
			if got, err := a.NodeDig(name); err != nil || !equal(got, want) {
				t.Errorf("%s with edge-a's API server down: %v %v, want [%s]", name, got, err, want)
			}
		}
		if out, err := a.NodeGet("http://" + ip + "/"); err != nil || field(out, "cluster") != a.Name {
			t.Errorf("ClusterSetIP %s with edge-a's API server down: %q %v, want edge-a's web", ip, out, err)
		}
		a.StartAPIServer(t)
	})

	// Restored: the ClusterSetIP leads to both clusters again.
	t.Run("after the partition", func(t *testing.T) {
		seen := map[string]int{}
		harness.Eventually(t, 2*time.Minute, func() error {
			out, err := a.Exec("demo", "client", "/workload", "get", "http://web.demo.svc.clusterset.local/")
			if err != nil {
				return err
			}
			seen[field(out, "cluster")]++
			if seen[a.Name] == 0 || seen[b.Name] == 0 {
				return fmt.Errorf("answers so far: %v", seen)
			}
			return nil
		})
	})

	t.Run("connectivity", func(t *testing.T) { testConnectivity(t, cs) })
	t.Run(a.Name+"/imports enforce", func(t *testing.T) { testEnforce(t, a, backends[a.Name]) })
	t.Run(b.Name+"/rollback to the stock add-on loses no cluster.local answer", func(t *testing.T) { testRollback(t, b) })
}

func equal(got []string, want ...string) bool {
	sort.Strings(got)
	sort.Strings(want)
	return strings.Join(got, ",") == strings.Join(want, ",")
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
