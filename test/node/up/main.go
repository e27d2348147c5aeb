// Command up brings up two real single-node clusters, edge-a and edge-b
// (test/node: kubelet, containerd, kube-proxy, each node in its own network
// namespace, Pod CIDRs routed between them), installs the product in both as
// the README says (kubeadm's DNS add-on first, then the overlays), adds the
// sample workloads of namespace demo, prints each kubeconfig and how to run a
// shell command in a Pod, and stays up until interrupted (Ctrl-C), then stops
// everything by PID. `make up` runs it (as root).
//
// It is how to try the product on real nodes in a few minutes, and what an
// external test suite (the upstream MCS conformance suite, say) can run
// against: the kubeconfigs reach each API server from this machine.
package main

import (
	"fmt"
	"os"

	"github.com/mcsannotations/mcsannotations/test/harness"
	"github.com/mcsannotations/mcsannotations/test/node"
)

func main() {
	p := harness.NewProgram("up", nil)
	ready := false
	ok, sig := p.RunUntilSignal(func() {
		tools := node.RequireTools(p)
		n := node.NewNetwork(p)
		a := node.StartCluster(p, n, tools, "edge-a")
		b := node.StartCluster(p, n, tools, "edge-b")
		cs := []*node.Cluster{a, b}
		for _, c := range cs {
			c.InstallStockDNS(p)
		}
		node.InstallClusterset(p, cs)
		for _, c := range cs {
			c.InstallDemo(p)
		}
		fmt.Println("== up: two clusters, our CoreDNS and the annotator (MCS controller) in each, namespace demo")
		for _, c := range cs {
			fmt.Printf("   %s: export KUBECONFIG=%s   (kubectl: %s)\n", c.Name, c.Kubeconfig, tools.Kubectl)
		}
		fmt.Printf(`   try, with edge-a's KUBECONFIG:
     kubectl -n demo exec client -- /workload lookup web.demo.svc.clusterset.local
     kubectl -n demo exec client -- /workload get http://web.demo.svc.clusterset.local/
     kubectl -n demo exec client -- /workload lookup backend-edge-b.edge-b.backend.demo.svc.clusterset.local
     kubectl get serviceimports -A
   Ctrl-C stops everything.
`)
		ready = true
		select {}
	})
	if sig != nil {
		fmt.Printf("== interrupted (%v): stopping every process by PID\n", sig)
	}
	p.RunCleanups()
	if procs, dirs := p.Leftovers(); len(procs) > 0 || len(dirs) > 0 {
		fmt.Fprintf(os.Stderr, "up: still running: %v; still present: %v\n", procs, dirs)
		os.Exit(1)
	}
	if !ready || (sig == nil && !ok) || p.Failed() {
		os.Exit(1)
	}
}
