package node

import (
	"testing"
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
