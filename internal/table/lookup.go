package table

import (
	"strings"

	"github.com/miekg/dns"
)

// Kind classifies an answer; the values double as metric labels.
type Kind uint8

// The answer kinds.
const (
	KindNXDomain     Kind = iota // name does not exist
	KindNoData                   // name exists, not with this type
	KindService                  // <svc>.<ns>.svc A/AAAA
	KindEndpoint                 // <hostname>.<clusterid>.<svc>.<ns>.svc A/AAAA
	KindSRV                      // SRV of the bare name or of _<port>._<proto>
	KindVersion                  // dns-version TXT
	KindApex                     // SOA or NS at the zone apex
	KindNameserver               // ns.dns.<zone> A/AAAA: the handler answers with its own address
	KindClusterSetIP             // <svc>.<ns>.svc A/AAAA of a ClusterSetIP service
	// KindPendingClusterSetIP: the name of a service exported as ClusterSetIP
	// whose ClusterSetIP is not known yet, where a controller is expected to
	// allocate it. The handler answers NODATA with a short negative TTL.
	KindPendingClusterSetIP
	numKinds
)

var kindNames = [...]string{"nxdomain", "nodata", "service", "endpoint", "srv", "version", "apex", "nameserver", "clustersetip", "clustersetip_pending"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Kinds lists every Kind, for pre-registering metric labels.
func Kinds() []Kind {
	out := make([]Kind, 0, numKinds)
	for k := Kind(0); k < numKinds; k++ {
		out = append(out, k)
	}
	return out
}

// Answer is the result of a lookup: references to templates that the caller
// copies into its response. Only the fields the Kind needs are set.
type Answer struct {
	Kind Kind
	A    []dns.A
	AAAA []dns.AAAA
	SRV  *SRVSet
	// FailOpen: the answer's service has every endpoint down by its probes
	// and answers with all of them.
	FailOpen bool
	// Clusters are the clusters whose endpoints' records the answer holds
	// (answer section and additional addresses), sorted, each once: what a
	// stale answer names. Nil for answers that hold no cluster's records
	// (a ClusterSetIP, the apex, NXDOMAIN, NODATA). Shared: read only.
	Clusters []string
}

// Lookup answers qname (lower case, fully qualified, inside the index's zone)
// for qtype. It does not allocate.
func (ix *Index) Lookup(qname string, qtype uint16) Answer {
	zone := ix.cfg.Zone
	if qname == zone {
		if qtype == dns.TypeSOA || qtype == dns.TypeNS {
			return Answer{Kind: KindApex}
		}
		return Answer{Kind: KindNoData}
	}
	if len(qname) <= len(zone) || !strings.HasSuffix(qname, zone) || qname[len(qname)-len(zone)-1] != '.' {
		return Answer{Kind: KindNXDomain}
	}
	rel := qname[:len(qname)-len(zone)-1] // "backend.default.svc"

	switch rel {
	case "dns-version":
		return exists(qtype == dns.TypeTXT, Answer{Kind: KindVersion})
	case "ns.dns":
		return exists(qtype == dns.TypeA || qtype == dns.TypeAAAA, Answer{Kind: KindNameserver})
	case "dns", "svc":
		return Answer{Kind: KindNoData} // empty non-terminals
	}
	prefix, key, _, ok := splitService(qname, zone)
	if !ok {
		// <ns>.svc: an empty non-terminal when the namespace has services.
		if ns, found := strings.CutSuffix(rel, ".svc"); found && strings.IndexByte(ns, '.') < 0 {
			if _, has := ix.namespaces[ns]; has {
				return Answer{Kind: KindNoData}
			}
		}
		return Answer{Kind: KindNXDomain}
	}
	if ci := ix.imports[key]; ci != nil {
		if a, ok := clusterSetIP(ci, prefix, qtype); ok {
			return a
		}
	}
	e := ix.services[key]
	if e == nil {
		return Answer{Kind: KindNXDomain}
	}
	ix.demand.mark(e)
	return ix.answer(e, prefix, qtype)
}

// answer answers a name under the service of e (no ClusterSetIP known for
// it). A service exported as ClusterSetIP never answers endpoint-form records
// at its service and port names: while a controller is expected to allocate
// its ClusterSetIP (ServiceImports are served, or it is not known yet whether
// they are), those names answer KindPendingClusterSetIP; where none can run
// (no ServiceImports served), the endpoints' addresses and SRV records in
// service form (target the service name). Endpoint names answer as always.
func (ix *Index) answer(e *entry, prefix string, qtype uint16) Answer {
	svc := e.get()
	if e.flags.Load()&entryClusterSetIP == 0 || (prefix != "" && prefix[0] != '_') {
		return svc.lookup(prefix, qtype)
	}
	if ix.importState == ImportsAbsent {
		return svc.serviceForm(ix.cfg.Zone, ix.cfg.TTL).lookup(prefix, qtype)
	}
	if prefix != "" && svc.SRV[prefix] == nil {
		return Answer{Kind: KindNXDomain}
	}
	return Answer{Kind: KindPendingClusterSetIP}
}

// SplitServiceName splits a name of the form
// [prefix.]<name>.<namespace>.svc.<zone> (qname lower case, fully qualified,
// zone fully qualified). The parts are substrings of qname.
func SplitServiceName(qname, zone string) (prefix, name, namespace string, ok bool) {
	prefix, key, dot, ok := splitService(qname, zone)
	if !ok {
		return "", "", "", false
	}
	return prefix, key[:dot], key[dot+1:], true
}

// SplitNamespaceName returns ns of a name <ns>.svc.<zone> (qname lower
// case, fully qualified, zone fully qualified).
func SplitNamespaceName(qname, zone string) (string, bool) {
	if len(qname) <= len(zone)+1 || !strings.HasSuffix(qname, zone) || qname[len(qname)-len(zone)-1] != '.' {
		return "", false
	}
	ns, found := strings.CutSuffix(qname[:len(qname)-len(zone)-1], ".svc")
	if !found || ns == "" || strings.IndexByte(ns, '.') >= 0 {
		return "", false
	}
	return ns, true
}

// splitService returns the prefix, the index key "<name>.<namespace>" (a
// substring of qname, so no allocation) and the position of its dot.
func splitService(qname, zone string) (prefix, key string, dot int, ok bool) {
	if len(qname) <= len(zone)+1 || !strings.HasSuffix(qname, zone) || qname[len(qname)-len(zone)-1] != '.' {
		return "", "", 0, false
	}
	rest, found := strings.CutSuffix(qname[:len(qname)-len(zone)-1], ".svc")
	if !found {
		return "", "", 0, false
	}
	nsDot := strings.LastIndexByte(rest, '.')
	if nsDot <= 0 || nsDot == len(rest)-1 {
		return "", "", 0, false
	}
	start := strings.LastIndexByte(rest[:nsDot], '.') + 1
	if start == nsDot || start == 1 { // empty name or empty prefix
		return "", "", 0, false
	}
	if start > 0 {
		prefix = rest[:start-1]
	}
	return prefix, rest[start:], nsDot - start, true
}

// LookupService answers a name under the service <name>.<namespace> —
// prefix "" for the service name itself, "_http._tcp" for a port, or
// "<hostname>.<clusterid>" for an endpoint — limited to cluster's endpoints
// when cluster is not "". Alias names use it. A ClusterSetIP service answers
// its service and port names with its ClusterSetIP (or as Lookup does while
// it is not known), unless cluster is set: the virtual IP leads to every
// cluster's endpoints, so an import limited to one cluster keeps that
// cluster's endpoints, in endpoint form.
func (ix *Index) LookupService(namespace, name, cluster, prefix string, qtype uint16) Answer {
	if cluster == "" {
		var buf [maxKey]byte
		key := serviceKey(buf[:0], namespace, name)
		if ci := ix.imports[string(key)]; ci != nil {
			if a, ok := clusterSetIP(ci, prefix, qtype); ok {
				return a
			}
		}
		e := ix.services[string(key)]
		if e == nil {
			return Answer{Kind: KindNXDomain}
		}
		ix.demand.mark(e)
		return ix.answer(e, prefix, qtype)
	}
	svc := ix.Service(namespace, name)
	if svc != nil {
		svc = svc.InCluster(cluster)
	}
	if svc == nil {
		return Answer{Kind: KindNXDomain}
	}
	return svc.lookup(prefix, qtype)
}

func (svc *Service) lookup(prefix string, qtype uint16) Answer {
	a := svc.answer(prefix, qtype)
	a.FailOpen = svc.FailOpen && a.Kind != KindNXDomain && a.Kind != KindNoData
	return a
}

func (svc *Service) answer(prefix string, qtype uint16) Answer {
	if prefix == "" {
		switch qtype {
		case dns.TypeA:
			return exists(len(svc.A) > 0, Answer{Kind: KindService, A: svc.A, Clusters: svc.clustersA})
		case dns.TypeAAAA:
			return exists(len(svc.AAAA) > 0, Answer{Kind: KindService, AAAA: svc.AAAA, Clusters: svc.clustersAAAA})
		case dns.TypeSRV:
			if set := svc.SRV[""]; set != nil && len(set.SRV) > 0 {
				return Answer{Kind: KindSRV, SRV: set, Clusters: set.Clusters}
			}
			return Answer{Kind: KindNoData}
		}
		return Answer{Kind: KindNoData}
	}
	if prefix[0] == '_' {
		set := svc.SRV[prefix]
		if set == nil {
			return Answer{Kind: KindNXDomain}
		}
		return exists(qtype == dns.TypeSRV && len(set.SRV) > 0, Answer{Kind: KindSRV, SRV: set, Clusters: set.Clusters})
	}
	if strings.IndexByte(prefix, '.') < 0 {
		// <clusterid>.<svc>.<ns>.svc is reserved by the MCS DNS specification.
		return Answer{Kind: KindNXDomain}
	}
	h := svc.Hosts[prefix]
	if h == nil {
		return Answer{Kind: KindNXDomain}
	}
	switch qtype {
	case dns.TypeA:
		return exists(len(h.A) > 0, Answer{Kind: KindEndpoint, A: h.A, Clusters: h.Clusters})
	case dns.TypeAAAA:
		return exists(len(h.AAAA) > 0, Answer{Kind: KindEndpoint, AAAA: h.AAAA, Clusters: h.Clusters})
	}
	return Answer{Kind: KindNoData}
}

// exists returns a when the name has data of the asked type, else NODATA.
func exists(has bool, a Answer) Answer {
	if has {
		return a
	}
	return Answer{Kind: KindNoData}
}
