package table

import (
	"bytes"
	"cmp"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Index is an immutable view of the table with every answer precomputed as
// record templates. Owner names in templates are lower case; the handler
// copies templates into the response (it never hands out the templates
// themselves, so no later plugin can mutate them). Answer templates (a
// service's or an endpoint's addresses, SRV records) share memory with
// other names' templates, so their owner names are not the name asked: the
// handler sets the owner. Additional-section templates carry their own.
type Index struct {
	cfg        Config
	serial     uint32
	services   map[string]*entry // "<svc>.<ns>"
	namespaces map[string]struct{}
	// visible holds, by namespace, the other namespaces allowed to resolve
	// at least one of its services (namespaces none of whose services
	// allows another are left out).
	visible map[string]*access
	// imports are the ClusterSetIP services, keyed as services are: their
	// service and port names answer with the ClusterSetIP instead of the
	// endpoints (which keep their own names). Shared with the table and
	// later indexes; never changed.
	imports map[string]*Service
	// demand records the services looked up, for a prober (health.go);
	// nil when none takes the list.
	demand *demand
	// importState: whether a controller is expected to allocate the
	// ClusterSetIPs of services exported as ClusterSetIP (Index.answer).
	importState ImportState

	SOA     dns.SOA
	NS      dns.NS
	Version dns.TXT
}

// Service holds the precomputed answers under <svc>.<ns>.svc.<zone>. Only
// services with at least one ready endpoint are in an index.
type Service struct {
	Namespace, Name string
	// A and AAAA cover the endpoints the locality policy selects.
	A    []dns.A
	AAAA []dns.AAAA
	// clustersA and clustersAAAA are the clusters of the records of A and
	// AAAA (Answer.Clusters).
	clustersA, clustersAAAA []string
	// SRV maps a name prefix to its records: "" for the bare service name,
	// "_http._tcp" for a named port, "_tcp" for the empty non-terminal.
	// Prefixes whose records are the same (a service with one named port)
	// share one set, so the owner name of SRV templates is the service's
	// for every prefix; responders set the owner.
	SRV map[string]*SRVSet
	// Hosts maps "<hostname>.<clusterid>" to that endpoint's addresses, for
	// every ready endpoint of every cluster.
	Hosts map[string]*Host
	// Endpoints counts the ready endpoints across clusters.
	Endpoints int
	// FailOpen: every ready endpoint failed its probes, and all of them are
	// answered (health.go).
	FailOpen bool
	// form is the service with its SRV answers in service form
	// (withServiceForm), rendered on first use (serviceForm).
	form     *Service
	formOnce sync.Once
	// perCluster holds the answers limited to one cluster, for imports that
	// name a cluster, rendered from pods on the first such lookup (split);
	// nil when every endpoint is in one cluster (then the service itself is
	// that cluster's answer).
	perCluster  map[string]*Service
	onlyCluster string // the one cluster, when every endpoint is in it
	split       sync.Once
	cfg         *Config
	pods        []*store.Pod // only until split
	budget      int          // the entry's, for the split
}

// InCluster returns the service's answers limited to cluster's endpoints
// ("" for the locality-selected answer), or nil when cluster has no ready
// endpoint.
func (s *Service) InCluster(cluster string) *Service {
	switch {
	case cluster == "":
		return s
	case s.onlyCluster != "":
		if cluster == s.onlyCluster {
			return s
		}
		return nil
	}
	s.split.Do(func() {
		one := *s.cfg
		one.Locality = Any
		s.perCluster = map[string]*Service{}
		sk := svcKey{s.Namespace, s.Name}
		eps := endpoints(sk, s.pods, one.Zone)
		for start := 0; start < len(eps); {
			end := start
			for end < len(eps) && eps[end].cluster == eps[start].cluster {
				end++
			}
			c := renderService(one, sk, eps[start:end], s.budget)
			c.onlyCluster = eps[start].cluster
			c.FailOpen = s.FailOpen
			s.perCluster[c.onlyCluster] = c
			start = end
		}
		s.pods, s.cfg = nil, nil
	})
	return s.perCluster[cluster]
}

// SRVSet is the SRV answer of one name with its additional addresses.
type SRVSet struct {
	SRV       []dns.SRV
	ExtraA    []dns.A
	ExtraAAAA []dns.AAAA
	// Clusters are the clusters of the SRV records' targets (Answer.Clusters).
	Clusters []string
}

// Host is one endpoint's addresses.
type Host struct {
	A    []dns.A
	AAAA []dns.AAAA
	// Clusters is the endpoint's cluster, alone (Answer.Clusters).
	Clusters []string
}

// entry is one service of an index: the Pods that export it, rendered into
// answers on first use. A rebuild makes entries only for the services that
// changed and renders none of them, so loading a large snapshot or a burst of
// changes costs no rendering until a name is asked for; every later query of
// the entry finds it rendered.
//
// An entry keeps its Pods (the table's list, shared, so no cost of its own):
// when the namespace's record cap shares out differently, an unchanged service
// gets a new entry with its new budget (see Table.capNamespaces).
type entry struct {
	cfg    *Config // the table's, shared by every entry
	sk     svcKey
	pods   []*store.Pod // immutable records, at least one of them ready (kept: a new cap renders them again)
	access access       // who else may resolve it
	cost   int          // the records a full render holds (recordCost)
	budget int          // the records it may hold; 0: no cap
	once   sync.Once
	// flags: entryFailOpen (pods are all of the service's, every ready one
	// down), set before the index is published; entryQueued (the entry is on
	// its index's demand list, linked by next).
	flags atomic.Uint32
	svc   *Service
	next  *entry
}

const (
	entryQueued uint32 = 1 << iota
	entryFailOpen
	// entryClusterSetIP: the service is exported as ClusterSetIP
	// (exportedClusterSetIP); set before the index is published.
	entryClusterSetIP
)

func (e *entry) get() *Service {
	e.once.Do(func() {
		e.svc = buildService(e.cfg, e.sk, e.pods, e.budget)
		if e.svc != nil {
			e.svc.FailOpen = e.flags.Load()&entryFailOpen != 0
		}
	})
	return e.svc
}

// Replies hold at most 65,535 octets (a DNS message's limit, over TCP too):
// the header (12), the question (its name and 4) and the records. No answer
// renders more records than fit there (roomFor). An address whose owner is the
// name asked costs 16 octets (A) or 28 (AAAA): the owner is a 2-octet pointer
// to the question. An SRV record costs its owner pointer, 16 octets of fixed
// fields and its target in full (miekg/dns never compresses SRV targets, as
// RFC 2782 asks). The additional addresses of SRV answers are counted with
// their owner name in full (a name past the first 16 KB of a message cannot
// be pointed to), in the room the SRV records leave: a server drops them
// first when a reply is too large. A reply to a query with EDNS0 also carries
// an OPT record, with an Extended DNS Error option when the answer is stale:
// the records leave room for both (roomEDNS).
const (
	maxMsg   = 65535
	sizeA    = 2 + 10 + 4
	sizeAAAA = 2 + 10 + 16
	sizeSRV  = 2 + 10 + 6 // and the target
	// roomEDNS: the OPT record (root owner, type, class, TTL, length) and an
	// EDE option (code, length, INFO-CODE, EXTRA-TEXT).
	roomEDNS = 1 + 10 + 4 + 2 + MaxEDEText
)

// MaxEDEText bounds the EXTRA-TEXT of the Extended DNS Error of a stale answer
// (octets): what the records of the largest answer leave room for.
const MaxEDEText = 100

// roomFor is the room for records in the largest reply to a question for
// qname (fully qualified).
func roomFor(qname string) int { return roomForLen(wireLen(qname)) }

// roomForLen is roomFor of a name n octets long on the wire.
func roomForLen(n int) int { return maxMsg - 12 - 4 - n - roomEDNS }

// wireLen is the length on the wire of a fully qualified name without escapes.
func wireLen(name string) int {
	if name == "." {
		return 1
	}
	return len(name) + 1
}

// maxSRV is the most SRV records of targets under a name fqdnLen octets long
// on the wire (<host>.<cluster>.<fqdn>, each label at least one octet) that
// fit a reply to a question for that name.
func maxSRV(fqdnLen int) int { return roomForLen(fqdnLen) / (sizeSRV + 4 + fqdnLen) }

// recordCost is how many records a full render of sk's answers holds, at
// most: each ready endpoint's addresses, and its SRV records (one per named
// port under the bare name and one under the port's name), with each SRV
// answer at most what fits a reply. It is what the per-namespace cap counts.
func recordCost(cfg *Config, sk svcKey, pods []*store.Pod) int {
	type portKey struct{ name, protocol string }
	addrs, eps, named, ports := 0, 0, 0, map[portKey]int{}
	for _, p := range pods {
		if !p.Ready || len(p.IPs) == 0 {
			continue
		}
		for _, e := range p.Exports {
			if e.Namespace != sk.Namespace || e.Name != sk.Name {
				continue
			}
			eps++
			addrs += len(p.IPs)
			for _, pt := range e.Ports {
				if pt.Name != "" {
					named++
					ports[portKey{pt.Name, pt.Protocol}]++
				}
			}
		}
	}
	if eps == 0 {
		return 0
	}
	// <name>.<namespace>.svc.<zone> on the wire, counted without building it.
	limit := maxSRV(len(sk.Name) + 1 + len(sk.Namespace) + len(".svc.") + len(cfg.Zone) + 1)
	cost := addrs + min(named, limit)
	for _, n := range ports {
		cost += min(n, limit)
	}
	return cost
}

// serves reports whether any of pods is a ready endpoint of sk: whether the
// service's names exist.
func serves(sk svcKey, pods []*store.Pod) bool {
	for _, p := range pods {
		if !p.Ready || len(p.IPs) == 0 {
			continue
		}
		for _, e := range p.Exports {
			if e.Namespace == sk.Namespace && e.Name == sk.Name {
				return true
			}
		}
	}
	return false
}

// Len returns the number of services with ready endpoints.
func (ix *Index) Len() int { return len(ix.services) }

// Serial is the SOA serial of this index.
func (ix *Index) Serial() uint32 { return ix.serial }

// Service returns the service <name>.<namespace>, or nil.
func (ix *Index) Service(namespace, name string) *Service {
	var buf [maxKey]byte
	if e := ix.services[string(serviceKey(buf[:0], namespace, name))]; e != nil {
		ix.demand.mark(e)
		return e.get()
	}
	return nil
}

// maxKey is the longest key of a service with Kubernetes names (two labels
// of up to 63 octets and a dot): serviceKey builds it on the stack.
const maxKey = 63 + 1 + 63

// serviceKey appends the index's key of <name>.<namespace> to b. Indexing a
// map with string(serviceKey(...)) copies nothing, so a lookup by namespace
// and name does not allocate (a concatenation would, past 32 bytes).
func serviceKey(b []byte, namespace, name string) []byte {
	b = append(b, name...)
	b = append(b, '.')
	return append(b, namespace...)
}

func newIndex(cfg Config, services map[string]*entry, imports map[string]*Service, serial uint32) *Index {
	ix := &Index{cfg: cfg, serial: serial, services: services, imports: imports, namespaces: make(map[string]struct{})}
	if ix.services == nil {
		ix.services = map[string]*entry{}
	}
	for _, e := range ix.services {
		ix.namespaces[e.sk.Namespace] = struct{}{}
		if e.access.all || len(e.access.ns) > 0 {
			if ix.visible == nil {
				ix.visible = map[string]*access{}
			}
			v := ix.visible[e.sk.Namespace]
			if v == nil {
				v = &access{}
				ix.visible[e.sk.Namespace] = v
			}
			v.all = v.all || e.access.all
			v.ns = append(v.ns, e.access.ns...) // sorted and compacted below
		}
	}
	for _, v := range ix.visible {
		slices.Sort(v.ns)
		v.ns = slices.Compact(v.ns)
	}
	for _, s := range ix.imports {
		ix.namespaces[s.Namespace] = struct{}{}
	}
	zone := cfg.Zone
	ix.SOA = dns.SOA{
		Hdr:     dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: cfg.TTL},
		Ns:      "ns.dns." + zone,
		Mbox:    "hostmaster." + zone,
		Serial:  serial,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  cfg.TTL,
	}
	ix.NS = dns.NS{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: cfg.TTL}, Ns: "ns.dns." + zone}
	ix.Version = dns.TXT{Hdr: dns.RR_Header{Name: "dns-version." + zone, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: cfg.TTL}, Txt: []string{"1.0.0"}}
	return ix
}

// access says which namespaces besides its own may resolve a service
// (imports enforce): every namespace, or the sorted ns.
type access struct {
	all bool
	ns  []string
}

func (a *access) allows(namespace string) bool {
	if a.all {
		return true
	}
	_, found := slices.BinarySearch(a.ns, namespace)
	return found
}

// accessOf is what every export of sk among pods allows: a service is open
// to another namespace only when each of its Pods' entries (each cluster's,
// each writer's) says so. The entries come normalised (annotation.CheckAllowed).
func accessOf(sk svcKey, pods []*store.Pod) access {
	var acc access
	first := true
	var last []string // the list seen before: the Pods of a service share it
	for _, p := range pods {
		for i := range p.Exports {
			e := &p.Exports[i]
			if e.Namespace != sk.Namespace || e.Name != sk.Name {
				continue
			}
			if !first && slices.Equal(e.Allowed, last) {
				continue
			}
			last = e.Allowed
			a := access{ns: e.Allowed}
			if len(e.Allowed) == 1 && e.Allowed[0] == annotation.AllNamespaces {
				a = access{all: true}
			}
			switch {
			case first:
				acc, first = a, false
			case a.all:
			case acc.all:
				acc = a
			default:
				var both []string
				for _, ns := range acc.ns {
					if _, ok := slices.BinarySearch(a.ns, ns); ok {
						both = append(both, ns)
					}
				}
				acc.ns = both
			}
		}
	}
	return acc
}

// Allowed reports whether Pods of namespace client may resolve the service
// <name>.<namespace> and the names under it: always in its own namespace,
// else when every export of it allows client. It does not allocate.
func (ix *Index) Allowed(namespace, name, client string) bool {
	if client == namespace {
		return true
	}
	var buf [maxKey]byte
	e := ix.services[string(serviceKey(buf[:0], namespace, name))]
	return e != nil && e.access.allows(client)
}

// Visible reports whether Pods of namespace client may resolve at least one
// service of namespace (then <namespace>.svc.<zone> exists for them).
func (ix *Index) Visible(namespace, client string) bool {
	if client == namespace {
		_, ok := ix.namespaces[namespace]
		return ok
	}
	v := ix.visible[namespace]
	return v != nil && v.allows(client)
}

// endpoint is one ready Pod backing one service, with that service's ports.
type endpoint struct {
	cluster, hostname string
	named             bool // its name can be encoded (EndpointNameFits): it has SRV records and an endpoint name
	ips               []netip.Addr
	ports             []portRef
	raw               []net.IP // ips as record data, shared by every template
	owner             string   // <hostname>.<cluster>.<svc>.<ns>.svc.<zone>
}

type portRef struct {
	prefix string // "_http._tcp"
	target uint16
}

// buildService renders one service from the Pods that export it; nil when
// none of them is ready (the name then does not exist).
func buildService(cfg *Config, sk svcKey, pods []*store.Pod, budget int) *Service {
	eps := endpoints(sk, pods, cfg.Zone)
	if len(eps) == 0 {
		return nil
	}
	s := renderService(*cfg, sk, eps, budget)
	if eps[0].cluster == eps[len(eps)-1].cluster { // sorted: one cluster
		s.onlyCluster = eps[0].cluster
	} else {
		// Few names ask for one cluster's answers (imports that name a
		// cluster): they are rendered when first asked (InCluster).
		s.cfg, s.pods, s.budget = cfg, pods, budget
	}
	return s
}

// endpoints lists the ready endpoints of sk among pods, sorted by cluster,
// hostname and address.
func endpoints(sk svcKey, pods []*store.Pod, zone string) []endpoint {
	var eps []endpoint
	for _, p := range pods {
		if !p.Ready || len(p.IPs) == 0 {
			continue
		}
		for _, e := range p.Exports {
			if e.Namespace != sk.Namespace || e.Name != sk.Name {
				continue
			}
			ep := endpoint{cluster: p.Cluster, hostname: p.EndpointHostname(), ips: p.IPs}
			ep.named = EndpointNameFits(ep.hostname, ep.cluster, sk.Name, sk.Namespace, zone)
			for _, pt := range e.Ports {
				if pt.Name == "" {
					continue // SRV names need a port name
				}
				ep.ports = append(ep.ports, portRef{"_" + pt.Name + "._" + strings.ToLower(pt.Protocol), uint16(pt.TargetPort)})
			}
			eps = append(eps, ep)
		}
	}
	slices.SortFunc(eps, func(a, b endpoint) int {
		return cmp.Or(cmp.Compare(a.cluster, b.cluster), cmp.Compare(a.hostname, b.hostname), a.ips[0].Compare(b.ips[0]))
	})
	return eps
}

// renderService precomputes the answers of one service from its ready
// endpoints, sorted by cluster.
//
// A budget above 0 caps the records it holds (the namespace's share, see
// Table.capNamespaces): endpoints are taken in order while their addresses
// fit it, and what is left is shared among the SRV answers. Whatever the
// budget, no answer holds more than fits a reply.
func renderService(cfg Config, sk svcKey, eps []endpoint, budget int) *Service {
	fqdn := sk.Name + "." + sk.Namespace + ".svc." + cfg.Zone
	left := -1 // records still allowed; -1: no cap
	if budget > 0 {
		left = budget
		n := 0
		for n < len(eps) && len(eps[n].ips) <= left {
			left -= len(eps[n].ips)
			n++
		}
		eps = eps[:n]
	}
	s := &Service{Namespace: sk.Namespace, Name: sk.Name, SRV: map[string]*SRVSet{}, Hosts: make(map[string]*Host, len(eps)), Endpoints: len(eps)}
	if len(eps) == 0 {
		return s
	}
	shareData(eps, fqdn)
	names := clusterNames(eps)

	// Every endpoint's own records, in eps order, in one array per family,
	// sized first so that the hosts' slices into them stay put. The service's
	// addresses and the SRV sets' additional ones are cut from these arrays
	// when they are the same records in the same order (see cut).
	all4, all6 := countAddrs(eps)
	hostA, hostAAAA := make([]dns.A, 0, all4), make([]dns.AAAA, 0, all6)
	slab := make([]Host, 0, len(eps))
	ci := 0 // the index in names of ep's cluster (eps are sorted by cluster)
	for _, ep := range eps {
		for names[ci] != ep.cluster {
			ci++
		}
		if !ep.named {
			continue // its addresses answer the service name only
		}
		key := hostKey(ep)
		h := s.Hosts[key]
		if h != nil {
			// Another endpoint with this hostname in this cluster: its
			// slices are full, so these appends copy them out of the arrays.
			for i, ip := range ep.ips {
				if !hasAddr(h, ip) {
					h.A, h.AAAA = appendAddr(h.A, h.AAAA, ep.owner, cfg.TTL, ep.raw[i])
				}
			}
			continue
		}
		slab = append(slab, Host{Clusters: names[ci : ci+1 : ci+1]})
		h = &slab[len(slab)-1]
		s.Hosts[key] = h
		start4, start6 := len(hostA), len(hostAAAA)
		for i, ip := range ep.ips {
			if !hasAddr(h, ip) {
				hostA, hostAAAA = appendAddr(hostA, hostAAAA, ep.owner, cfg.TTL, ep.raw[i])
				h.A, h.AAAA = full(hostA[start4:]), full(hostAAAA[start6:])
			}
		}
	}

	selected := eps
	if cfg.Locality == PreferLocal {
		var local []endpoint
		for _, ep := range eps {
			if ep.cluster == cfg.LocalCluster {
				local = append(local, ep)
			}
		}
		if len(local) > 0 {
			selected = local
		}
	}

	n4, n6 := countAddrs(selected)
	if n4 > 0 {
		s.A = make([]dns.A, 0, n4)
	}
	if n6 > 0 {
		s.AAAA = make([]dns.AAAA, 0, n6)
	}
	maxA, maxAAAA := roomFor(fqdn)/sizeA, roomFor(fqdn)/sizeAAAA
	seen := make(map[netip.Addr]struct{}, n4+n6)
	for _, ep := range selected {
		for i, ip := range ep.ips {
			if _, dup := seen[ip]; dup || (len(ep.raw[i]) == net.IPv4len && len(s.A) == maxA) || (len(ep.raw[i]) != net.IPv4len && len(s.AAAA) == maxAAAA) {
				continue
			}
			seen[ip] = struct{}{}
			s.A, s.AAAA = appendAddr(s.A, s.AAAA, fqdn, cfg.TTL, ep.raw[i])
			if len(ep.raw[i]) == net.IPv4len {
				s.clustersA = appendCluster(s.clustersA, ep.cluster)
			} else {
				s.clustersAAAA = appendCluster(s.clustersAAAA, ep.cluster)
			}
		}
	}
	s.clustersA, s.clustersAAAA = cut(names, s.clustersA, sameString), cut(names, s.clustersAAAA, sameString)
	// The handler names the owner of these: only the addresses must match.
	s.A = cut(hostA, s.A, func(a, b *dns.A) bool { return bytes.Equal(a.A, b.A) })
	s.AAAA = cut(hostAAAA, s.AAAA, func(a, b *dns.AAAA) bool { return bytes.Equal(a.AAAA, b.AAAA) })

	// Each SRV answer holds at most what fits a reply (room, in octets) and,
	// under a budget, its share of what is left: the bare name's answer and
	// each port's get as much.
	perSet := -1
	if left >= 0 {
		names := map[string]struct{}{}
		for _, ep := range selected {
			for _, pr := range ep.ports {
				names[pr.prefix] = struct{}{}
			}
		}
		perSet = left / (len(names) + 1)
	}
	room := map[*SRVSet]*srvRoom{}
	for _, ep := range selected {
		if !ep.named {
			continue // a target that cannot be encoded would spoil the whole reply
		}
		target := ep.owner
		for _, pr := range ep.ports {
			for _, prefix := range []string{"", pr.prefix} {
				set := s.SRV[prefix]
				if set == nil {
					n := len(selected)
					if perSet >= 0 {
						n = min(n, perSet)
					}
					set = &SRVSet{SRV: make([]dns.SRV, 0, n), ExtraA: make([]dns.A, 0, min(n4, n)), ExtraAAAA: make([]dns.AAAA, 0, min(n6, n))}
					s.SRV[prefix] = set
					owner := fqdn
					if prefix != "" {
						owner = prefix + "." + fqdn
					}
					room[set] = &srvRoom{owner: owner, srv: roomFor(owner), all: roomFor(owner)}
				}
				if perSet >= 0 && len(set.SRV) >= perSet {
					continue
				}
				if addSRV(set, target, pr.target, cfg.TTL, s.Hosts[hostKey(ep)], room[set]) {
					set.Clusters = appendCluster(set.Clusters, ep.cluster)
				}
			}
			// The protocol label alone ("_tcp") is an empty non-terminal.
			if ent := pr.prefix[strings.IndexByte(pr.prefix, '.')+1:]; s.SRV[ent] == nil {
				s.SRV[ent] = &SRVSet{}
			}
		}
	}
	all := s.SRV[""]
	for prefix, set := range s.SRV {
		if n := len(set.SRV); n > 0 {
			w := uint16(max(1, 100/n))
			for i := range set.SRV {
				set.SRV[i].Weight = w
			}
		}
		set.ExtraA = cut(hostA, set.ExtraA, func(a, b *dns.A) bool { return a.Hdr.Name == b.Hdr.Name && bytes.Equal(a.A, b.A) })
		set.ExtraAAAA = cut(hostAAAA, set.ExtraAAAA, func(a, b *dns.AAAA) bool { return a.Hdr.Name == b.Hdr.Name && bytes.Equal(a.AAAA, b.AAAA) })
		set.Clusters = cut(names, set.Clusters, sameString)
		if prefix != "" && sameSRV(set, all) {
			s.SRV[prefix] = all
		}
	}
	return s
}

// countAddrs counts the IPv4 and IPv6 addresses of eps.
func countAddrs(eps []endpoint) (n4, n6 int) {
	for _, ep := range eps {
		for _, ip := range ep.raw {
			if len(ip) == net.IPv4len {
				n4++
			} else {
				n6++
			}
		}
	}
	return n4, n6
}

// full is s with its capacity cut to its length (nil when empty): an append
// to it copies, so it never writes into what s is cut from.
func full[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s[:len(s):len(s)]
}

// cut returns the run of pool that holds the same records as got, in the same
// order, so that got's own array can go; got itself when pool has no such run
// (it tries the first few places where got's first record is found).
func cut[T any](pool, got []T, same func(a, b *T) bool) []T {
	if len(got) == 0 {
		return got
	}
	tries := 0
	for i := 0; i+len(got) <= len(pool) && tries < 4; i++ {
		if !same(&pool[i], &got[0]) {
			continue
		}
		tries++
		j := 1
		for j < len(got) && same(&pool[i+j], &got[j]) {
			j++
		}
		if j == len(got) {
			return full(pool[i : i+len(got)])
		}
	}
	return got
}

// sameSRV reports whether two sets answer alike (owner names aside): the same
// targets and ports in the same order, so the same additional addresses.
func sameSRV(a, b *SRVSet) bool {
	if a == nil || b == nil || len(a.SRV) != len(b.SRV) || len(a.SRV) == 0 {
		return false
	}
	for i := range a.SRV {
		if a.SRV[i].Target != b.SRV[i].Target || a.SRV[i].Port != b.SRV[i].Port {
			return false
		}
	}
	return true
}

// srvRoom is what is left of a reply for an SRV answer: for its SRV records
// alone, and for them with their additional addresses.
type srvRoom struct {
	owner    string
	srv, all int
}

// addSRV adds the record (target, port) to set unless it is there already or
// does not fit the room left, and the target's addresses to the additional
// section while they fit; it reports whether it added the record. Endpoints
// come sorted, so a target's records are the last ones added: the check for a
// duplicate looks at those only.
func addSRV(set *SRVSet, target string, port uint16, ttl uint32, h *Host, room *srvRoom) bool {
	newTarget := true
	for i := len(set.SRV) - 1; i >= 0 && set.SRV[i].Target == target; i-- {
		if set.SRV[i].Port == port {
			return false // identical (target, port) pairs collapse
		}
		newTarget = false
	}
	size := sizeSRV + wireLen(target)
	if size > room.srv {
		return false
	}
	room.srv -= size
	room.all -= size
	set.SRV = append(set.SRV, dns.SRV{
		Hdr:    dns.RR_Header{Name: room.owner, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: ttl},
		Target: target, Port: port,
	})
	if newTarget && h != nil {
		if extra := len(h.A)*(sizeA-2+wireLen(target)) + len(h.AAAA)*(sizeAAAA-2+wireLen(target)); extra <= room.all {
			room.all -= extra
			set.ExtraA = append(set.ExtraA, h.A...)
			set.ExtraAAAA = append(set.ExtraAAAA, h.AAAA...)
		}
	}
	return true
}

// clusterNames lists the clusters of eps (sorted by cluster), each once.
func clusterNames(eps []endpoint) []string {
	var names []string
	for _, ep := range eps {
		names = appendCluster(names, ep.cluster)
	}
	return names
}

// appendCluster appends cluster to a list built in cluster order unless it
// is its last one already.
func appendCluster(clusters []string, cluster string) []string {
	if len(clusters) > 0 && clusters[len(clusters)-1] == cluster {
		return clusters
	}
	return append(clusters, cluster)
}

func sameString(a, b *string) bool { return *a == *b }

func hasAddr(h *Host, ip netip.Addr) bool {
	for _, r := range h.A {
		if a, _ := netip.AddrFromSlice(r.A); a.Unmap() == ip.Unmap() {
			return true
		}
	}
	for _, r := range h.AAAA {
		if a, _ := netip.AddrFromSlice(r.AAAA); a == ip {
			return true
		}
	}
	return false
}

// shareData fills each endpoint's raw addresses and owner name once, in two
// allocations for the addresses of the whole service and one per owner name:
// the A, AAAA, SRV and additional-section templates all point into them (the
// handler copies address bytes into each response, so sharing is safe).
func shareData(eps []endpoint, fqdn string) {
	n, size := 0, 0
	for _, ep := range eps {
		n += len(ep.ips)
		for _, ip := range ep.ips {
			size += ip.Unmap().BitLen() / 8
		}
	}
	raws := make([]net.IP, 0, n)
	buf := make([]byte, 0, size)
	for i := range eps {
		ep := &eps[i]
		start := len(raws)
		for _, ip := range ep.ips {
			at := len(buf)
			buf = append(buf, ip.Unmap().AsSlice()...)
			raws = append(raws, net.IP(buf[at:len(buf):len(buf)]))
		}
		ep.raw = raws[start:len(raws):len(raws)]
		ep.owner = ep.hostname + "." + ep.cluster + "." + fqdn
	}
}

// hostKey is "<hostname>.<cluster>", a prefix of the endpoint's owner name
// (so the key costs no memory of its own).
func hostKey(ep endpoint) string { return ep.owner[:len(ep.hostname)+1+len(ep.cluster)] }

func appendAddr(as []dns.A, aaaas []dns.AAAA, owner string, ttl uint32, ip net.IP) ([]dns.A, []dns.AAAA) {
	if len(ip) == net.IPv4len {
		return append(as, dns.A{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: ip}), aaaas
	}
	return as, append(aaaas, dns.AAAA{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: ttl}, AAAA: ip})
}

// EndpointNameFits reports whether the endpoint name
// <hostname>.<cluster>.<svc>.<ns>.svc.<zone> (zone fully qualified) can be
// written in a DNS message: every label of 1 to 63 octets, at most 255
// octets in all, no escapes. A longer cluster ID, hostname or service name
// would make the packer refuse every record of the reply, or a resolver refuse
// the whole reply. It does not allocate.
func EndpointNameFits(hostname, cluster, svc, ns, zone string) bool {
	n := 0 // octets on the wire: each label's length byte and bytes, then the root
	for _, part := range [...]string{hostname, cluster, svc, ns, "svc"} {
		if !labelsFit(part) {
			return false
		}
		n += len(part) + 1
	}
	if zone != "." {
		if !labelsFit(strings.TrimSuffix(zone, ".")) {
			return false
		}
		n += len(zone)
	}
	return n+1 <= 255
}

// labelsFit reports whether s is one or more dot-separated labels of 1 to 63
// octets with no escape.
func labelsFit(s string) bool {
	if s == "" || strings.IndexByte(s, '\\') >= 0 {
		return false
	}
	for s != "" {
		i := strings.IndexByte(s, '.')
		if i < 0 {
			i = len(s)
		}
		if i == 0 || i > 63 {
			return false
		}
		if i < len(s) {
			i++
			if i == len(s) {
				return false // a trailing dot: an empty label
			}
		}
		s = s[i:]
	}
	return true
}
