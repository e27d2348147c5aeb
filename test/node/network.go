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
	// DualStack: every node has an IPv6 address too (in Subnet6), its Pod
	// CIDR an IPv6 /64 beside the IPv4 one (in PodNetwork6), routed like
	// the IPv4 ones; the clusters get IPv6 Service CIDRs (ServiceCIDR6).
	// Unique local addresses (fd00::/8) of this network's own.
	DualStack    bool
	Subnet6      netip.Prefix // the hub's IPv6 /64 (nodes only: the test speaks IPv4 to them)
	PodNetwork6  netip.Prefix // every node's IPv6 Pod CIDR is in it
	ServiceCIDR6 netip.Prefix // each cluster's IPv6 Service range
	nodes        []*netNode
}

type netNode struct {
	name, netns string
	ip          netip.Addr
	podCIDR     netip.Prefix
	ip6         netip.Addr   // DualStack only
	podCIDR6    netip.Prefix // DualStack only
}

const cmdTimeout = 30 * time.Second

// NewNetwork makes the hub and the host veth; Close removes them.
func NewNetwork(t harness.T) *Network {
	t.Helper()
	return newNetwork(t, false)
}

// NewDualStackNetwork is NewNetwork with IPv6 as well (Network.DualStack).
func NewDualStackNetwork(t harness.T) *Network {
	t.Helper()
	return newNetwork(t, true)
}

func newNetwork(t harness.T, dual bool) *Network {
	t.Helper()
	id := make([]byte, 2)
	if _, err := rand.Read(id); err != nil {
		t.Fatalf("node: %v", err)
	}
	third, _ := rand.Int(rand.Reader, big.NewInt(200))
	n := &Network{ID: hex.EncodeToString(id), DualStack: dual}
	if dual {
		// fd + 40 bits: "6d63" (mcs) and the network's ID, then 16 bits
		// of subnet: 0 the hub, 1 the Services, 0x100+ the Pod CIDRs.
		pre := "fd6d:6300:" + n.ID + ":"
		n.Subnet6 = netip.MustParsePrefix(pre + ":/64")
		n.ServiceCIDR6 = netip.MustParsePrefix(pre + "1::/112")
		n.PodNetwork6 = netip.MustParsePrefix(pre + "100::/56")
	}
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
	if n.DualStack {
		nd.ip6 = nth6(n.Subnet6, 0x10+i)
		a := n.PodNetwork6.Addr().As16()
		a[7] = byte(i + 1) // the /64 number i+1 of the /56
		nd.podCIDR6 = netip.PrefixFrom(netip.AddrFrom16(a), 64)
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
	sysctls := []string{"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"}
	if n.DualStack {
		// No duplicate address detection in the node's namespace: its
		// addresses are usable at once (nothing else is on this network).
		sysctls = append(sysctls, "net.ipv6.conf.all.forwarding=1", "net.bridge.bridge-nf-call-ip6tables=1",
			"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.eth0.accept_dad=0")
	}
	for _, s := range sysctls {
		if _, err := run(cmdTimeout, nd.netns, "sysctl", "-qw", s); err != nil {
			t.Fatalf("node: network: %v", err)
		}
	}
	if n.DualStack {
		n.must(t, append(ns, "-6", "addr", "add", nd.ip6.String()+"/64", "dev", "eth0", "nodad"))
	}
	for _, o := range n.nodes[:i] {
		n.must(t,
			append(ns, "route", "add", o.podCIDR.String(), "via", o.ip.String()),
			[]string{"ip", "-n", o.netns, "route", "add", nd.podCIDR.String(), "via", nd.ip.String()},
		)
		if n.DualStack {
			n.must(t,
				append(ns, "-6", "route", "add", o.podCIDR6.String(), "via", o.ip6.String()),
				[]string{"ip", "-n", o.netns, "-6", "route", "add", nd.podCIDR6.String(), "via", nd.ip6.String()},
			)
		}
	}
	return nd.netns, nd.ip, nd.podCIDR
}

// nth6 is the i-th address of an IPv6 prefix (i < 65536).
func nth6(p netip.Prefix, i int) netip.Addr {
	a := p.Addr().As16()
	a[14], a[15] = byte(i>>8), byte(i)
	return netip.AddrFrom16(a)
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
		dsts := [][2]string{{"iptables", p[1].ip.String()}, {"iptables", p[1].podCIDR.String()}}
		if n.DualStack {
			dsts = append(dsts, [2]string{"ip6tables", p[1].ip6.String()}, [2]string{"ip6tables", p[1].podCIDR6.String()})
		}
		for _, dst := range dsts {
			for _, chain := range []string{"OUTPUT", "FORWARD"} {
				if _, err := run(cmdTimeout, p[0].netns, dst[0], "-w", "5", op, chain, "-d", dst[1], "-j", "DROP"); err != nil {
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
