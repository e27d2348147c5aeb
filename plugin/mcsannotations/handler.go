package mcsannotations

import (
	"context"
	"net"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/plugin/table"
)

// ServeDNS implements plugin.Handler. Answers come from the current index
// alone: nothing on this path waits on an API server or a lock.
func (m *MCS) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	qname := state.Name()
	if plugin.Zones(m.zones).Matches(qname) != m.zones[0] {
		// Not the clusterset zone (alias zones are not answered yet): the
		// next plugin gets the query untouched.
		return plugin.NextOrFailure(m.Name(), m.Next, ctx, w, r)
	}

	ix := m.table.Index()
	ans := ix.Lookup(qname, state.QType())
	if ans.Kind == table.KindNXDomain && m.fall.Through(qname) {
		return plugin.NextOrFailure(m.Name(), m.Next, ctx, w, r)
	}

	msg := new(dns.Msg)
	msg.SetReply(r)
	msg.Authoritative = true
	owner := state.QName() // answers echo the name as asked
	switch ans.Kind {
	case table.KindService, table.KindEndpoint:
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
	case table.KindNoData:
		soa := ix.SOA
		msg.Ns = []dns.RR{&soa}
	}
	answers.WithLabelValues(metrics.WithServer(ctx), ans.Kind.String()).Inc()
	w.WriteMsg(msg)
	return dns.RcodeSuccess, nil
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
