package node

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestStockDNS: kubeadm's DNS add-on, running our image with kubeadm's
// Corefile, serves a Pod through the kube-dns Service: the Pod's own
// resolver (kubelet-written resolv.conf: nameserver 10.96.0.10, search list,
// ndots 5) finds the kubernetes Service by its short and full names.
func TestStockDNS(t *testing.T) {
	tools := RequireTools(t)
	n := NewNetwork(t)
	c := StartCluster(t, n, tools, "edge-a")
	c.InstallStockDNS(t)
	c.CreatePod(t, WorkloadPod("default", "client", c.Name, nil))
	for _, name := range []string{"kubernetes.default.svc.cluster.local", "kubernetes.default", "kubernetes"} {
		got := c.Lookup(t, "default", "client", name)
		if len(got) != 1 || got[0] != "10.96.0.1" {
			t.Errorf("lookup %s from a Pod: %v, want [10.96.0.1]", name, got)
		}
	}
}

// InstallStockDNS applies kubeadm's DNS add-on (testdata/kubeadm-coredns.yaml)
// and waits until the coredns Deployment has a ready replica.
func (c *Cluster) InstallStockDNS(t harness.T) {
	t.Helper()
	if out, err := c.Kubectl(time.Minute, "apply", "-f", filepath.Join("testdata", "kubeadm-coredns.yaml")); err != nil {
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
