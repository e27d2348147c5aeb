package probe

import (
	"fmt"
	"net/netip"
)

// Reason is why a target is not probed although its service is asked.
type Reason string

// Why targets are not probed. The address classes are refused because a
// tenant names its Pods' addresses: a probe there would reach CoreDNS's own
// host (loopback, unspecified), the node's link (link-local, where cloud
// metadata services answer) or many hosts at once (multicast, broadcast),
// and its result would tell the tenant what listens there.
const (
	Loopback    Reason = "loopback"
	Unspecified Reason = "unspecified"
	LinkLocal   Reason = "link_local"
	Multicast   Reason = "multicast"
	Broadcast   Reason = "broadcast"
	// Denied is an address inside one of Config.Deny's prefixes.
	Denied Reason = "denied"
	// PortCap is a port of an address that already has
	// Config.PortsPerAddress other ports probed this round.
	PortCap Reason = "ports_per_address"
)

// Reasons lists every Reason, for metrics that show each from the start.
var Reasons = []Reason{Loopback, Unspecified, LinkLocal, Multicast, Broadcast, Denied, PortCap}

var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// class is the refused class of a, or "": a's IPv4-mapped form counts as
// the IPv4 address it maps.
func class(a netip.Addr) Reason {
	a = a.Unmap()
	switch {
	case !a.IsValid() || a.IsUnspecified() || (a.Is4() && a.As4()[0] == 0): // 0.0.0.0/8: "this network"
		return Unspecified
	case a.IsLoopback():
		return Loopback
	case a.IsMulticast():
		return Multicast
	case a.Zone() != "" || a.IsLinkLocalUnicast():
		return LinkLocal
	case a == broadcast:
		return Broadcast
	}
	return ""
}

// refuse says why a is never probed, or "" when it may be: a Deny prefix
// holds it, or it is of a refused class and no Allow prefix holds it.
func (c Config) refuse(a netip.Addr) Reason {
	a = a.Unmap()
	for _, p := range c.Deny {
		if p.Contains(a) {
			return Denied
		}
	}
	r := class(a)
	if r == "" {
		return ""
	}
	for _, p := range c.Allow {
		if p.Contains(a) {
			return ""
		}
	}
	return r
}

// Prefix is p as refuse compares it: masked, and an IPv4-mapped prefix
// (::ffff:10.0.0.0/104) as the IPv4 prefix it maps, since addresses are
// compared unmapped.
func Prefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// Refusal reports a target that is not probed: it stays in the answers as
// it would without probing, whether anything listens there or not.
type Refusal struct {
	Endpoint Endpoint
	Reason   Reason
	// Log is false when the report is over the log's rate (about one a
	// second, bursts of ten); Suppressed counts the reports not logged
	// since the last one that was.
	Log        bool
	Suppressed int
}

// Why says in words why the target is not probed.
func (r Refusal) Why(cfg Config) string {
	a := r.Endpoint.Addr.Addr()
	switch r.Reason {
	case Denied:
		return fmt.Sprintf("%s is in a denied prefix of the probe word", a)
	case PortCap:
		return fmt.Sprintf("%d other ports of %s are probed (ports_per_address %d)", cfg.PortsPerAddress, a, cfg.PortsPerAddress)
	}
	return fmt.Sprintf("%s is %s", a, classWords[r.Reason])
}

var classWords = map[Reason]string{
	Loopback:    "a loopback address",
	Unspecified: "an unspecified address (0.0.0.0/8, ::)",
	LinkLocal:   "a link-local address",
	Multicast:   "a multicast address",
	Broadcast:   "the broadcast address",
}
