package node

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Network is the flat network the nodes share, made of network namespaces
// and veths the test creates, removed by Close:
//
//   - a hub namespace holding a bridge, the "switch";
//   - a veth from the test's own namespace into the hub, HostIP on our side:
//     the test reaches each node's API server through it;
//   - per node, a namespace whose eth0 (NodeIP) plugs into the hub, with
//     routes to every other node's Pod CIDR (routable Pod CIDRs, as Cilium or
//     Submariner would give).
//
// Nothing else on the machine is touched: no address, route or rule outside
// these namespaces and veths.
type Network struct {
	ID     string       // random, in every name: runs side by side do not meet
	Subnet netip.Prefix // the hub's /24
	HostIP netip.Addr   // our end of the host veth
	Hub    string       // the hub's namespace
	nodes  []*netNode
}

type netNode struct {
	name, netns string
	ip          netip.Addr
	podCIDR     netip.Prefix
}

const cmdTimeout = 30 * time.Second

// NewNetwork makes the hub and the host veth; Close removes them.
func NewNetwork(t harness.T) *Network {
	t.Helper()
	id := make([]byte, 2)
	if _, err := rand.Read(id); err != nil {
		t.Fatalf("node: %v", err)
	}
	third, _ := rand.Int(rand.Reader, big.NewInt(200))
	n := &Network{ID: hex.EncodeToString(id)}
	n.Subnet = netip.MustParsePrefix(fmt.Sprintf("10.250.%d.0/24", 20+third.Int64()))
	n.HostIP = nth(n.Subnet, 1)
	n.Hub = "mcs-" + n.ID + "-hub"
	t.Cleanup(func() { n.Close(t) })
	host, hubSide := "mcs"+n.ID+"h", "mcs"+n.ID+"hh"
	n.must(t,
		[]string{"ip", "netns", "add", n.Hub},
		[]string{"ip", "-n", n.Hub, "link", "set", "lo", "up"},
		[]string{"ip", "-n", n.Hub, "link", "add", "br0", "type", "bridge"},
		[]string{"ip", "-n", n.Hub, "link", "set", "br0", "up"},
		[]string{"ip", "link", "add", host, "type", "veth", "peer", "name", hubSide},
		[]string{"ip", "link", "set", hubSide, "netns", n.Hub},
		[]string{"ip", "-n", n.Hub, "link", "set", hubSide, "master", "br0", "up"},
		[]string{"ip", "addr", "add", n.HostIP.String() + "/24", "dev", host},
		[]string{"ip", "link", "set", host, "up"},
	)
	return n
}

func nth(p netip.Prefix, i int) netip.Addr {
	a := p.Addr().As4()
	a[3] += byte(i)
	return netip.AddrFrom4(a)
}

func (n *Network) must(t harness.T, cmds ...[]string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := run(cmdTimeout, "", c...); err != nil {
			t.Fatalf("node: network: %v", err)
		}
	}
}

// AddNode makes a node's namespace plugged into the hub, with Pod CIDR
// 10.244.<index>.0/24 routed to it from every node (existing and later).
func (n *Network) AddNode(t harness.T, name string) (netns string, ip netip.Addr, podCIDR netip.Prefix) {
	t.Helper()
	i := len(n.nodes)
	nd := &netNode{
		name:    name,
		netns:   "mcs-" + n.ID + "-" + name,
		ip:      nth(n.Subnet, 10+i),
		podCIDR: netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i+1)),
	}
	n.nodes = append(n.nodes, nd)
	nodeSide, hubSide := fmt.Sprintf("mcs%sn%d", n.ID, i), fmt.Sprintf("mcs%sb%d", n.ID, i)
	ns := []string{"ip", "-n", nd.netns}
	n.must(t,
		[]string{"ip", "netns", "add", nd.netns},
		append(ns, "link", "set", "lo", "up"),
		[]string{"ip", "link", "add", nodeSide, "type", "veth", "peer", "name", hubSide},
		[]string{"ip", "link", "set", hubSide, "netns", n.Hub},
		[]string{"ip", "-n", n.Hub, "link", "set", hubSide, "master", "br0", "up"},
		[]string{"ip", "link", "set", nodeSide, "netns", nd.netns},
		append(ns, "link", "set", nodeSide, "name", "eth0"),
		append(ns, "addr", "add", nd.ip.String()+"/24", "dev", "eth0"),
		append(ns, "link", "set", "eth0", "up"),
		// Anything not for the clusterset goes to the test's end of the
		// host veth, which forwards nothing further.
		append(ns, "route", "add", "default", "via", n.HostIP.String()),
	)
	// Forwarding (Pods, Services) and bridged Pod traffic through iptables
	// (kube-proxy's DNAT for replies between Pods on one bridge): settings
	// of the node's own namespace.
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"} {
		if _, err := run(cmdTimeout, nd.netns, "sysctl", "-qw", s); err != nil {
			t.Fatalf("node: network: %v", err)
		}
	}
	for _, o := range n.nodes[:i] {
		n.must(t,
			append(ns, "route", "add", o.podCIDR.String(), "via", o.ip.String()),
			[]string{"ip", "-n", o.netns, "route", "add", nd.podCIDR.String(), "via", nd.ip.String()},
		)
	}
	return nd.netns, nd.ip, nd.podCIDR
}

func (n *Network) node(name string) *netNode {
	for _, nd := range n.nodes {
		if nd.name == name {
			return nd
		}
	}
	return nil
}

// Cut drops every packet between nodes a and b (their node IPs and Pod
// CIDRs), and only those: each keeps reaching the test and any other node.
func (n *Network) Cut(t harness.T, a, b string) { n.cut(t, a, b, "-I") }

// Restore undoes Cut.
func (n *Network) Restore(t harness.T, a, b string) { n.cut(t, a, b, "-D") }

func (n *Network) cut(t harness.T, a, b, op string) {
	t.Helper()
	na, nb := n.node(a), n.node(b)
	if na == nil || nb == nil {
		t.Fatalf("node: cut %s-%s: unknown node", a, b)
	}
	for _, p := range [][2]*netNode{{na, nb}, {nb, na}} {
		for _, dst := range []string{p[1].ip.String(), p[1].podCIDR.String()} {
			for _, chain := range []string{"OUTPUT", "FORWARD"} {
				if _, err := run(cmdTimeout, p[0].netns, "iptables", "-w", "5", op, chain, "-d", dst, "-j", "DROP"); err != nil {
					t.Fatalf("node: cut %s-%s: %v", a, b, err)
				}
			}
		}
	}
}

// Close removes the namespaces (and with them the veths, bridge, routes and
// iptables rules in them) and the host veth.
func (n *Network) Close(t harness.T) {
	var errs []string
	for _, nd := range n.nodes {
		if _, err := run(cmdTimeout, "", "ip", "netns", "del", nd.netns); err != nil {
			errs = append(errs, err.Error())
		}
	}
	n.nodes = nil
	if _, err := run(cmdTimeout, "", "ip", "link", "del", "mcs"+n.ID+"h"); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		errs = append(errs, err.Error())
	}
	if _, err := run(cmdTimeout, "", "ip", "netns", "del", n.Hub); err != nil && !strings.Contains(err.Error(), "No such file") {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		t.Errorf("node: network cleanup: %s", strings.Join(errs, "; "))
	}
}
