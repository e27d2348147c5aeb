package table

import (
	"cmp"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/mcsannotations/mcsannotations/internal/clustersetip"
)

// ClusterSetIP and ImportPort are internal/clustersetip's (shared with the
// snapshot, which must not depend on this package).
type (
	ClusterSetIP = clustersetip.ClusterSetIP
	ImportPort   = clustersetip.ImportPort
)

// SetClusterSetIPs makes list the complete set of ClusterSetIP services (a
// later entry for the same service wins; entries without IPs are left out).
// The answers are rendered here, off the index builder, and the next index
// serves them.
func (t *Table) SetClusterSetIPs(list []ClusterSetIP) {
	rendered := make(map[string]*Service, len(list))
	byKey := make(map[string]ClusterSetIP, len(list))
	for _, ci := range list {
		key := ci.Name + "." + ci.Namespace
		if len(ci.IPs) == 0 {
			delete(byKey, key)
			delete(rendered, key)
			continue
		}
		byKey[key] = ci
		rendered[key] = renderClusterSetIP(t.cfg, ci)
	}
	kept := make([]ClusterSetIP, 0, len(byKey))
	for _, ci := range byKey {
		kept = append(kept, ci)
	}
	slices.SortFunc(kept, func(a, b ClusterSetIP) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	t.mu.Lock()
	t.importList, t.imports = kept, rendered
	t.gen++
	t.mu.Unlock()
	t.signal()
}

// ClusterSetIPs returns the ClusterSetIP services last set, sorted by
// namespace and name. The caller must not change them.
func (t *Table) ClusterSetIPs() []ClusterSetIP {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.importList)
}

// ClusterSetIPLen returns the number of ClusterSetIP services of the index.
func (ix *Index) ClusterSetIPLen() int { return len(ix.imports) }

// clusterSetIP answers the names of a ClusterSetIP service: the service name
// (prefix "") and its ports' SRV names ("_http._tcp", and "_tcp" as an empty
// non-terminal). ok is false for other names (endpoint names stay with the
// endpoints' answers).
func clusterSetIP(svc *Service, prefix string, qtype uint16) (Answer, bool) {
	if prefix != "" && prefix[0] != '_' {
		return Answer{}, false
	}
	a := svc.lookup(prefix, qtype)
	if a.Kind == KindService {
		a.Kind = KindClusterSetIP
	}
	return a, true
}

// renderClusterSetIP precomputes the answers of a ClusterSetIP service: its
// IPs as the service name's A and AAAA records, one SRV record per named port
// (target the service name itself, the IPs in the additional section), and
// the same records together for the bare service name.
func renderClusterSetIP(cfg Config, ci ClusterSetIP) *Service {
	fqdn := ci.Name + "." + ci.Namespace + ".svc." + cfg.Zone
	s := &Service{Namespace: ci.Namespace, Name: ci.Name, SRV: map[string]*SRVSet{}}
	ips := slices.Clone(ci.IPs)
	slices.SortFunc(ips, netip.Addr.Compare)
	ips = slices.Compact(ips)
	for _, ip := range ips {
		ip = ip.Unmap()
		s.A, s.AAAA = appendAddr(s.A, s.AAAA, fqdn, cfg.TTL, net.IP(ip.AsSlice()))
	}
	all := &SRVSet{ExtraA: s.A, ExtraAAAA: s.AAAA}
	allRoom := &srvRoom{owner: fqdn, srv: roomFor(fqdn), all: roomFor(fqdn)}
	for _, p := range ci.Ports {
		if p.Name == "" || p.Port == 0 {
			continue // SRV names need a port name
		}
		proto := "_" + strings.ToLower(cmp.Or(p.Protocol, "TCP"))
		prefix := "_" + strings.ToLower(p.Name) + "." + proto
		if s.SRV[prefix] != nil {
			continue // a duplicate port name: the first one counts
		}
		set := &SRVSet{ExtraA: s.A, ExtraAAAA: s.AAAA}
		addSRV(set, fqdn, p.Port, cfg.TTL, nil, &srvRoom{owner: prefix + "." + fqdn, srv: roomFor(prefix + "." + fqdn), all: roomFor(prefix + "." + fqdn)})
		set.SRV[0].Weight = 100
		s.SRV[prefix] = set
		addSRV(all, fqdn, p.Port, cfg.TTL, nil, allRoom) // identical ports collapse
		if s.SRV[proto] == nil {
			s.SRV[proto] = &SRVSet{} // the protocol label: an empty non-terminal
		}
	}
	if n := len(all.SRV); n > 0 {
		for i := range all.SRV {
			all.SRV[i].Weight = uint16(max(1, 100/n))
		}
		s.SRV[""] = all
	}
	return s
}
