// Package node runs real single-node Kubernetes clusters on one machine,
// without Docker, for the tests that need what only a real node does: a Pod
// running our images under a kubelet, resolving names through its
// kubelet-written resolv.conf, the kube-dns Service and kube-proxy, and
// connecting to ClusterSetIPs.
//
// Each cluster is one node in a network namespace of its own (NewNetwork,
// StartCluster): etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, containerd + runc, kubelet and kube-proxy (iptables mode),
// with the CNI bridge plugin for Pods. Nodes share a flat network (a bridge
// in a hub namespace), Pod CIDRs routed between them; the test reaches each
// API server through a veth into the hub. NewDualStackNetwork adds IPv6
// (unique local addresses): IPv6 node addresses, Pod CIDRs and Service
// ranges beside the IPv4 ones. Images are side-loaded with `ctr
// images import` (no registry): `make image`'s archives and the test images
// (workload, pause) from `make node-images`.
//
// Everything is started and stopped by PID; a failure prints the last lines
// of every component's log. The tests need root (namespaces, cgroups,
// containerd) and `tools/install.sh node`; `make e2e-node` runs them.
package node
