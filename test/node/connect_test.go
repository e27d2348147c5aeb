package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// connectTries is how many connections each Connectivity check makes.
const connectTries = 20

// answers makes n HTTP GETs of url from a Pod and counts the answers by the
// cluster that sent them ("" counts failed requests).
func answers(c *Cluster, ns, pod, url string, n int) map[string]int {
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		out, err := c.Exec(ns, pod, "/workload", "get", url)
		if err != nil {
			seen[""]++
			continue
		}
		seen[field(out, "cluster")]++
	}
	return seen
}

// testConnectivity follows the upstream MCS conformance suite's
// Connectivity spec (a service that no cluster exports is unreachable by
// its clusterset name from every cluster; once exported, it is reachable
// through DNS from every cluster), and goes further: traffic goes only to
// the clusters that export, and each port only to the clusters whose
// Service has it. Service connect/conn exists in both clusters, with port
// http in edge-a and ports http and alt in edge-b; requests come from Pod
// demo/client of each cluster, by name, through the ClusterSetIP.
func testConnectivity(t *testing.T, cs []*Cluster) {
	a, b := cs[0], cs[1]
	a.ApplyYAML(t, ConnectObjects(a.Name, false))
	b.ApplyYAML(t, ConnectObjects(b.Name, true))
	for _, c := range cs {
		c.WaitPodReady(t, "connect", "conn-"+c.Name)
	}
	const name = "conn.connect.svc.clusterset.local"

	t.Run("not exported: unreachable", func(t *testing.T) {
		for _, c := range cs {
			for i := 0; i < 3; i++ {
				if got, err := c.LookupErr("demo", "client", name); err == nil {
					t.Errorf("%s from %s before any export: %v, want no answer", name, c.Name, got)
				}
			}
			if seen := answers(c, "demo", "client", "http://"+name+"/", 3); seen[""] != 3 {
				t.Errorf("GET %s from %s before any export: %v, want no answer", name, c.Name, seen)
			}
		}
	})

	t.Run("exported by edge-a only: reachable, edge-a only", func(t *testing.T) {
		a.ApplyYAML(t, ConnectExport)
		for _, c := range cs {
			ip := c.ClusterSetIP(t, "connect", "conn")
			waitLookup(t, c, "demo", "client", name, ip)
			var seen map[string]int
			harness.Eventually(t, 2*time.Minute, func() error {
				if seen = answers(c, "demo", "client", "http://"+name+"/", 1); seen[a.Name] == 0 {
					return fmt.Errorf("GET %s from %s: %v", name, c.Name, seen)
				}
				return nil
			})
			seen = answers(c, "demo", "client", "http://"+name+"/", connectTries)
			if seen[a.Name] == 0 || seen[b.Name] != 0 {
				t.Errorf("GET %s from %s, %d times: %v, want edge-a's conn only (edge-b does not export)", name, c.Name, connectTries, seen)
			}
		}
	})

	t.Run("exported by both: port http to both, port alt to edge-b only", func(t *testing.T) {
		b.ApplyYAML(t, ConnectExport)
		for _, c := range cs {
			// The import has both ports once edge-b's export is read.
			c.waitFor(t, "ServiceImport connect/conn with ports http and alt", func() error {
				out, err := c.Kubectl(time.Minute, "-n", "connect", "get", "serviceimports.multicluster.x-k8s.io", "conn",
					"-o", "jsonpath={.spec.ports[*].name}")
				if err != nil {
					return err
				}
				if got := strings.Fields(out); !equal(got, "alt", "http") {
					return fmt.Errorf("ports %v", got)
				}
				return nil
			})
			seen := map[string]int{}
			harness.Eventually(t, 2*time.Minute, func() error {
				for k, v := range answers(c, "demo", "client", "http://"+name+"/", 1) {
					seen[k] += v
				}
				if seen[a.Name] == 0 || seen[b.Name] == 0 {
					return fmt.Errorf("GET %s:80 from %s: %v, want both clusters", name, c.Name, seen)
				}
				return nil
			})
			alt := "http://" + name + ":81/"
			harness.Eventually(t, 2*time.Minute, func() error {
				if s := answers(c, "demo", "client", alt, 1); s[b.Name] == 0 {
					return fmt.Errorf("GET %s from %s: %v", alt, c.Name, s)
				}
				return nil
			})
			if seen := answers(c, "demo", "client", alt, connectTries); seen[b.Name] != connectTries {
				t.Errorf("GET %s from %s, %d times: %v, want edge-b's conn every time (edge-a's Service has no port alt)", alt, c.Name, connectTries, seen)
			}
		}
	})
}

// waitLookup waits (bounded) until name resolves to want in a Pod.
func waitLookup(t *testing.T, c *Cluster, ns, pod, name string, want ...string) {
	t.Helper()
	harness.Eventually(t, 2*time.Minute, func() error {
		got, err := c.LookupErr(ns, pod, name)
		if err != nil {
			return err
		}
		if !equal(got, want...) {
			return fmt.Errorf("%s from %s/%s in %s: %v, want %v", name, ns, pod, c.Name, got, want)
		}
		return nil
	})
}

// testEnforce turns on `imports enforce` in edge-a's Corefile (the overlay's
// ConfigMap, edited in place, then CoreDNS's Pod restarted) and checks it as
// a Pod meets it through kube-dns: a Pod of namespace other, which web's
// exporters did not allow, gets no such host for web's clusterset name,
// while it resolves backend (whose exporters allow other) and a Pod of
// namespace demo still resolves web. The plugin tells the Pods apart by the
// query's source address, their Pod IPs: the allowed answer shows that no
// SNAT hid the Pod on its way to CoreDNS (an unknown client is refused
// everything).
func testEnforce(t *testing.T, c *Cluster, backend string) {
	c.ApplyYAML(t, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: other\n")
	c.CreatePod(t, WorkloadPod("other", "outsider", c.Name, nil))
	web := c.ClusterSetIP(t, "demo", "web")
	const webName, backendName = "web.demo.svc.clusterset.local", "backend.demo.svc.clusterset.local"
	// Before: no enforcement, the outsider resolves web.
	waitLookup(t, c, "other", "outsider", webName, web)

	ctx := context.Background()
	cm, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	line := "cluster " + c.Name + "\n"
	i := strings.Index(cm.Data["Corefile"], line)
	if i < 0 {
		t.Fatalf("edge-a's Corefile has no %q:\n%s", line, cm.Data["Corefile"])
	}
	indent := cm.Data["Corefile"][strings.LastIndex(cm.Data["Corefile"][:i], "\n")+1 : i]
	cm.Data["Corefile"] = cm.Data["Corefile"][:i+len(line)] + indent + "imports enforce\n" + cm.Data["Corefile"][i+len(line):]
	if _, err := c.Client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl(time.Minute, "-n", "kube-system", "delete", "pod", "-l", "app.kubernetes.io/name=coredns-mcsannotations", "--wait=true"); err != nil {
		t.Fatalf("delete CoreDNS Pod: %v\n%s", err, out)
	}
	c.WaitRollout(t, "kube-system", "coredns")

	harness.Eventually(t, 2*time.Minute, func() error {
		got, err := c.LookupErr("other", "outsider", webName)
		if err == nil {
			return fmt.Errorf("%s from other/outsider under imports enforce: %v, want no such host", webName, got)
		}
		if !strings.Contains(err.Error(), "no such host") {
			return fmt.Errorf("%s from other/outsider under imports enforce: %v, want no such host", webName, err)
		}
		t.Logf("%s from other/outsider under imports enforce: %v", webName, err)
		return nil
	})
	waitLookup(t, c, "other", "outsider", backendName, backend)
	waitLookup(t, c, "demo", "client", webName, web)
}

// testRollback re-applies kubeadm's DNS add-on over ours (RestoreStockDNS)
// while Pod default/prober resolves kubernetes.default every 100 ms, and
// counts the lookups lost. Target and bound: none. Our CoreDNS Pod leaves
// the kube-dns Service while it still answers (its readiness probe, see
// manifests/coredns/deployment.yaml), so that kube-proxy forgets the UDP
// flows that lead to it before it exits.
func testRollback(t *testing.T, c *Cluster) {
	eps := c.WatchDNSEndpoints()
	defer eps.Stop()
	probe := c.StartProbe("default", "prober", "kubernetes.default.svc.cluster.local", 60*time.Second)
	time.Sleep(3 * time.Second) // the probe runs before the switch starts
	c.RestoreStockDNS(t)
	out := <-probe
	ok, fail, err := ParseProbe(out)
	if err != nil || ok == 0 || fail > 0 {
		t.Errorf("kubernetes.default.svc.cluster.local every 100 ms across the rollback: %s\nkube-dns endpoints:\n%s\nkube-proxy:\n%s",
			out, eps, c.ConntrackCleanups())
	} else {
		t.Logf("kubernetes.default.svc.cluster.local every 100 ms across the rollback: %s\nkube-dns endpoints:\n%s\nkube-proxy:\n%s",
			out, eps, c.ConntrackCleanups())
	}
	if got := c.Lookup(t, "default", "prober", "kubernetes.default.svc.cluster.local"); !equal(got, "10.96.0.1") {
		t.Errorf("kubernetes.default.svc.cluster.local after the rollback: %v, want [10.96.0.1]", got)
	}
}
