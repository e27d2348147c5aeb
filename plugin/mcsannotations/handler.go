package mcsannotations

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/internal/table"
)

// ServeDNS implements plugin.Handler. Answers come from the current index
// and the client index alone: nothing on this path waits on an API server.
func (m *MCS) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	// CoreDNS's server answers a message with no question itself, before any
	// plugin. The unpacker writes the name in presentation form (escapes
	// included), so this is state.Name() without its second pass over the
	// name (sprintName).
	qname := strings.ToLower(r.Question[0].Name)
	zone := m.zoneOf(qname)
	if zone == "" {
		return plugin.NextOrFailure(m.Name(), m.Next, ctx, w, r)
	}
	ix := m.table.Index()

	// An alias answers only for the Pod that declared it, in either zone.
	if m.clients.HasImporters() {
		if ans, ok := m.alias(ctx, ix, state, qname, zone); ok {
			return m.respond(ctx, w, r, state, ix, zone, ans)
		}
	}
	if zone != m.zones[0] {
		// An alias zone (cluster.local): everything else goes to the next
		// plugin untouched.
		return plugin.NextOrFailure(m.Name(), m.Next, ctx, w, r)
	}
	var ans table.Answer
	if reason := m.refusal(ix, state, qname); reason != "" {
		// Exactly what a name that does not exist gets.
		refused.WithLabelValues(metrics.WithServer(ctx), reason).Inc()
		ans = table.Answer{Kind: table.KindNXDomain}
	} else {
		ans = ix.Lookup(qname, state.QType())
	}
	if ans.Kind == table.KindNXDomain && m.fall.Through(qname) {
		return plugin.NextOrFailure(m.Name(), m.Next, ctx, w, r)
	}
	return m.respond(ctx, w, r, state, ix, zone, ans)
}

// CacheBypassZones implements the cache plugin's ZoneBypasser: the cache of
// the same server block passes queries in these zones straight on, neither
// answering from nor storing into its cache. Answers in every zone of the
// plugin may depend on who asks (alias names are per client Pod, imports
// enforce refuses per client), and the cache keys on the name alone: it
// would hand one client's alias answer, or refusal, to the next client
// asking the same name. The answers come from memory anyway.
func (m *MCS) CacheBypassZones() []string { return append([]string(nil), m.zones...) }

// zoneOf returns the longest of the plugin's zones that qname (lower case,
// fully qualified) is in, or "". The zones are normalised at setup, so a
// suffix test does what plugin.Zones.Matches does, without its allocations.
func (m *MCS) zoneOf(qname string) string {
	best := ""
	for _, z := range m.zones {
		if len(z) > len(best) && inZone(qname, z) {
			best = z
		}
	}
	return best
}

func inZone(qname, zone string) bool {
	if zone == "." {
		return true
	}
	return qname == zone || (len(qname) > len(zone) && strings.HasSuffix(qname, zone) && qname[len(qname)-len(zone)-1] == '.')
}

// clientIP is the query's source address.
func (m *MCS) clientIP(state request.Request) netip.Addr {
	ip, _ := netip.ParseAddr(state.IP())
	return ip.Unmap()
}

// alias answers <alias>.<podns>.svc.<zone> (and names under it) for a client
// Pod that imports a service under that alias. A target with no ready
// endpoint is no answer: the name then resolves as if there were no alias.
func (m *MCS) alias(ctx context.Context, ix *table.Index, state request.Request, qname, zone string) (table.Answer, bool) {
	prefix, name, ns, ok := table.SplitServiceName(qname, zone)
	if !ok {
		return table.Answer{}, false
	}
	c := m.clients.Lookup(m.clientIP(state))
	if c == nil || c.Namespace != ns {
		return table.Answer{}, false
	}
	imp, ok := c.Alias(name)
	if !ok {
		return table.Answer{}, false
	}
	if m.enforce && !ix.Allowed(imp.Namespace, imp.Name, c.Namespace) {
		// An import never grants access: the name resolves as if there
		// were no alias.
		refused.WithLabelValues(metrics.WithServer(ctx), "not_allowed").Inc()
		return table.Answer{}, false
	}
	ans := ix.LookupService(imp.Namespace, imp.Name, imp.Cluster, prefix, state.QType())
	return ans, ans.Kind != table.KindNXDomain
}

// refusal applies imports enforce to a clusterset name: a client may resolve
// the services of its own namespace, and those of another namespace that allow
// its namespace (annotation.Export.Allowed: the exporter decides, an import
// never grants access); clients that are not known local Pods, only from an
// allowed CIDR. <ns>.svc.<zone> exists for a client only when it may resolve
// some service there, so a refusal reads as a name that does not exist. It
// returns the reason for a refusal, or "" (always "" without enforce). Names
// that are not service or namespace names are never refused.
func (m *MCS) refusal(ix *table.Index, state request.Request, qname string) string {
	if !m.enforce {
		return ""
	}
	_, name, ns, ok := table.SplitServiceName(qname, m.zones[0])
	if !ok {
		ns, ok = table.SplitNamespaceName(qname, m.zones[0])
		if !ok {
			return ""
		}
	}
	ip := m.clientIP(state)
	for _, p := range m.allow {
		if p.Contains(ip) {
			return ""
		}
	}
	c := m.clients.Lookup(ip)
	switch {
	case c == nil:
		return "unknown_client"
	case c.Namespace == ns:
		return ""
	case name == "" && ix.Visible(ns, c.Namespace):
		return ""
	case name != "" && ix.Allowed(ns, name, c.Namespace):
		return ""
	}
	return "not_allowed"
}

// respond writes ans as the reply to r.
func (m *MCS) respond(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, state request.Request, ix *table.Index, zone string, ans table.Answer) (int, error) {
	msg := new(dns.Msg)
	msg.SetReply(r)
	msg.Authoritative = true
	owner := r.Question[0].Name // answers echo the name as asked (state.QName(), as above)
	switch ans.Kind {
	case table.KindService, table.KindEndpoint, table.KindClusterSetIP:
		msg.Answer = appendAddrs(nil, ans.A, ans.AAAA, owner)
	case table.KindSRV:
		msg.Answer = copySRV(ans.SRV.SRV, owner)
		msg.Extra = appendAddrs(nil, ans.SRV.ExtraA, ans.SRV.ExtraAAAA, "")
	case table.KindVersion:
		txt := ix.Version
		txt.Hdr.Name = owner
		msg.Answer = []dns.RR{&txt}
	case table.KindApex:
		if state.QType() == dns.TypeSOA {
			soa := ix.SOA
			soa.Hdr.Name = owner
			msg.Answer = []dns.RR{&soa}
		} else {
			ns := ix.NS
			ns.Hdr.Name = owner
			msg.Answer = []dns.RR{&ns}
			if rr := selfAddr(state, ns.Ns, ns.Hdr.Ttl); rr != nil {
				msg.Extra = []dns.RR{rr}
			}
		}
	case table.KindNameserver:
		if rr := selfAddr(state, owner, ix.NS.Hdr.Ttl); rr != nil && rr.Header().Rrtype == state.QType() {
			msg.Answer = []dns.RR{rr}
		} else {
			ans.Kind = table.KindNoData
		}
	}
	switch ans.Kind {
	case table.KindNXDomain:
		msg.Rcode = dns.RcodeNameError
		fallthrough
	case table.KindNoData, table.KindPendingClusterSetIP:
		soa := ix.SOA
		if zone != m.zones[0] { // an alias name in an alias zone
			soa.Hdr.Name, soa.Ns, soa.Mbox = zone, "ns.dns."+zone, "hostmaster."+zone
		}
		if ans.Kind == table.KindPendingClusterSetIP {
			// Resolvers cache this NODATA for the SOA's TTL or minimum,
			// whichever is less: ask again soon, the IP is on its way.
			soa.Hdr.Ttl, soa.Minttl = min(soa.Hdr.Ttl, pendingTTL), min(soa.Minttl, pendingTTL)
			m.logPending(state, zone)
		}
		msg.Ns = []dns.RR{&soa}
	}
	if len(ans.Clusters) > 0 {
		m.markStale(msg, r, ans.Clusters)
	}
	answers.WithLabelValues(metrics.WithServer(ctx), ans.Kind.String()).Inc()
	if ans.FailOpen {
		failOpenAnswers.Inc()
	}
	w.WriteMsg(msg)
	return dns.RcodeSuccess, nil
}

// pendingTTL is the negative TTL of the answer of a ClusterSetIP service
// whose ClusterSetIP is not known yet (table.KindPendingClusterSetIP).
const pendingTTL = 5

// maxPendingLogged bounds the services logPending remembers.
const maxPendingLogged = 10000

// logPending logs, once per service, that a ClusterSetIP service is answered
// NODATA while its ClusterSetIP is not known (answers_total counts every such
// answer, kind clustersetip_pending).
func (m *MCS) logPending(state request.Request, zone string) {
	_, name, ns, ok := table.SplitServiceName(state.Name(), zone)
	if !ok {
		return
	}
	key := ns + "/" + name
	m.pendingMu.Lock()
	defer m.pendingMu.Unlock()
	if _, seen := m.pendingLogged[key]; seen || len(m.pendingLogged) >= maxPendingLogged {
		return
	}
	if m.pendingLogged == nil {
		m.pendingLogged = map[string]struct{}{}
	}
	m.pendingLogged[key] = struct{}{}
	log.Infof("%s: exported as ClusterSetIP, its ClusterSetIP not known yet (no ServiceImport with IPs; ServiceImports %s): answered NODATA, TTL %ds, until the MCS controller allocates it",
		key, m.table.Index().ImportState(), pendingTTL)
}

// appendAddrs copies address templates into rrs, IP bytes included, in three
// allocations for any number of records. A non-empty owner replaces the
// templates' owner name.
func appendAddrs(rrs []dns.RR, as []dns.A, aaaas []dns.AAAA, owner string) []dns.RR {
	if len(as)+len(aaaas) == 0 {
		return rrs
	}
	if rrs == nil {
		rrs = make([]dns.RR, 0, len(as)+len(aaaas))
	}
	ipb := make([]byte, 0, net.IPv4len*len(as)+net.IPv6len*len(aaaas))
	if len(as) > 0 {
		cp := append([]dns.A(nil), as...)
		for i := range cp {
			if owner != "" {
				cp[i].Hdr.Name = owner
			}
			n := len(ipb)
			ipb = append(ipb, cp[i].A...)
			cp[i].A = ipb[n:len(ipb):len(ipb)]
			rrs = append(rrs, &cp[i])
		}
	}
	if len(aaaas) > 0 {
		cp := append([]dns.AAAA(nil), aaaas...)
		for i := range cp {
			if owner != "" {
				cp[i].Hdr.Name = owner
			}
			n := len(ipb)
			ipb = append(ipb, cp[i].AAAA...)
			cp[i].AAAA = ipb[n:len(ipb):len(ipb)]
			rrs = append(rrs, &cp[i])
		}
	}
	return rrs
}

func copySRV(srvs []dns.SRV, owner string) []dns.RR {
	cp := append([]dns.SRV(nil), srvs...)
	rrs := make([]dns.RR, len(cp))
	for i := range cp {
		cp[i].Hdr.Name = owner
		rrs[i] = &cp[i]
	}
	return rrs
}

// selfAddr is the address the query arrived on, as the A or AAAA record of
// name: what ns.dns.<zone> resolves to.
func selfAddr(state request.Request, name string, ttl uint32) dns.RR {
	ip := net.ParseIP(state.LocalIP())
	if ip == nil {
		return nil
	}
	hdr := dns.RR_Header{Name: name, Class: dns.ClassINET, Ttl: ttl}
	if v4 := ip.To4(); v4 != nil {
		hdr.Rrtype = dns.TypeA
		return &dns.A{Hdr: hdr, A: v4}
	}
	hdr.Rrtype = dns.TypeAAAA
	return &dns.AAAA{Hdr: hdr, AAAA: ip}
}
