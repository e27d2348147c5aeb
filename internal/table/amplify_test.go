package table

import (
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// amplifyPods is the attack shape of issue 26: pods Pods in namespace ns,
// each exporting services services with ports named ports, all inside the
// annotation's limits.
func amplifyPods(ns string, pods, services, ports int) []*store.Pod {
	exports := make([]annotation.Export, services)
	for s := range exports {
		e := annotation.Export{Name: fmt.Sprintf("svc-%d", s), Namespace: ns, Cluster: "edge-a"}
		for p := range ports {
			e.Ports = append(e.Ports, annotation.Port{Name: fmt.Sprintf("p%d", p), Port: int32(1000 + p), TargetPort: int32(1000 + p), Protocol: "TCP"})
		}
		exports[s] = e
	}
	c := &store.Common{Cluster: "edge-a", Namespace: ns, Exports: exports}
	out := make([]*store.Pod, pods)
	for i := range out {
		out[i] = &store.Pod{Common: c, Name: fmt.Sprintf("pod-%d", i), Ready: true,
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})}}
	}
	return out
}

// askAll asks every name of every service of ns, so that all answers are
// rendered, and returns the records they hold (each set counted once) and
// the largest reply in octets, packed as a server would over TCP.
func askAll(t testing.TB, ix *Index, ns string, services, ports int) (records, largest int) {
	seen := map[*SRVSet]bool{}
	for s := range services {
		fqdn := fmt.Sprintf("svc-%d.%s.svc.%s", s, ns, zone)
		names := []string{fqdn}
		for p := range ports {
			names = append(names, fmt.Sprintf("_p%d._tcp.%s", p, fqdn))
		}
		for _, q := range names {
			for _, qt := range []uint16{dns.TypeA, dns.TypeSRV} {
				a := ix.Lookup(q, qt)
				m := new(dns.Msg)
				m.SetQuestion(q, qt)
				// The owner of answers is the name asked, as the handler sets it.
				for _, r := range a.A {
					r.Hdr.Name = q
					m.Answer = append(m.Answer, &r)
				}
				if a.SRV != nil {
					for _, r := range a.SRV.SRV {
						r.Hdr.Name = q
						m.Answer = append(m.Answer, &r)
					}
					for i := range a.SRV.ExtraA {
						m.Extra = append(m.Extra, &a.SRV.ExtraA[i])
					}
					if !seen[a.SRV] {
						seen[a.SRV] = true
						records += len(a.SRV.SRV)
					}
				}
				// A stale answer to a query with EDNS0 carries an OPT record
				// with an Extended DNS Error of the longest text.
				m.SetEdns0(dns.MaxMsgSize, false)
				opt := m.IsEdns0()
				opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeStaleAnswer, ExtraText: strings.Repeat("x", MaxEDEText)})
				// Over TCP the server truncates to the largest message,
				// additional records first: every answer must stay.
				answers := len(m.Answer)
				m.Truncate(dns.MaxMsgSize)
				if len(m.Answer) != answers {
					t.Fatalf("%s %s: %d of %d answers fit a reply", q, dns.TypeToString[qt], len(m.Answer), answers)
				}
				b, err := m.Pack()
				if err != nil {
					t.Fatalf("%s %s: %d records do not pack: %v", q, dns.TypeToString[qt], len(m.Answer)+len(m.Extra), err)
				}
				largest = max(largest, len(b))
			}
		}
		svc := ix.Service(ns, fmt.Sprintf("svc-%d", s))
		if svc == nil {
			continue
		}
		for _, h := range svc.Hosts {
			records += len(h.A) + len(h.AAAA)
		}
	}
	return records, largest
}

// No answer holds more than fits the largest reply: 5,000 endpoints answer
// with the A records that fit 65,535 octets, a service of 2,000 endpoints
// with the SRV records that fit, and every reply packs.
func TestAnswersFitAReply(t *testing.T) {
	tb := newTable(cfg())
	tb.ReplaceCluster("edge-a", amplifyPods("big", 5000, 1, 1))
	ix := tb.Rebuild()
	a := ix.Lookup("svc-0.big.svc."+zone, dns.TypeA)
	if want := roomFor("svc-0.big.svc."+zone) / sizeA; len(a.A) != want {
		t.Errorf("%d A records, want the %d that fit a reply", len(a.A), want)
	}
	srv := ix.Lookup("svc-0.big.svc."+zone, dns.TypeSRV)
	if n := len(srv.SRV.SRV); n < 900 || n >= 1000 {
		t.Errorf("%d SRV records, want the 900 to 1000 that fit a reply", n)
	}
	if _, largest := askAll(t, ix, "big", 1, 1); largest > dns.MaxMsgSize || largest < dns.MaxMsgSize-200 {
		t.Errorf("the largest reply has %d octets, want just under %d", largest, dns.MaxMsgSize)
	}
}

// The records a namespace's answers hold stay within NamespaceRecords
// whatever its Pods export (each service gets a share, and the smaller ones
// all they need); the cap is reported once per change, and a namespace
// within it is not touched. It fails without the cap: 100 Pods x 16
// services x 20 named ports render about 40,000 records.
func TestNamespaceRecordsCap(t *testing.T) {
	const limit = 5000
	c := cfg()
	c.NamespaceRecords = limit
	tb := newTable(c)
	type report struct{ records, capped int }
	reports := map[string][]report{}
	tb.OnCapped(func(ns string, records, capped int) { reports[ns] = append(reports[ns], report{records, capped}) })
	pods := append(amplifyPods("hostile", 100, 16, 20), amplifyPods("quiet", 10, 2, 2)...)
	// A small service beside the big ones in the hostile namespace: it
	// needs less than a share and gets all of it.
	small := &store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "hostile", Exports: []annotation.Export{{Name: "small", Namespace: "hostile", Cluster: "edge-a",
		Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 80, Protocol: "TCP"}}}}}, Name: "small-0", Ready: true, IPs: []netip.Addr{netip.MustParseAddr("10.2.0.1")}}
	tb.ReplaceCluster("edge-a", append(pods, small))
	ix := tb.Rebuild()

	records, largest := askAll(t, ix, "hostile", 16, 20)
	if records > limit || records < limit/2 {
		t.Errorf("the hostile namespace holds %d records, want at most %d (and most of it used)", records, limit)
	}
	if largest > dns.MaxMsgSize {
		t.Errorf("a reply of %d octets", largest)
	}
	if got := srvs(ix.Lookup("small.hostile.svc."+zone, dns.TypeSRV)); len(got) != 1 {
		t.Errorf("the small service lost its answer: %v", got)
	}
	if q, _ := askAll(t, ix, "quiet", 2, 2); q != 2*(10+10*2+10*2) {
		t.Errorf("quiet namespace: %d records", q)
	}
	if len(reports["hostile"]) != 1 || reports["hostile"][0].capped <= 0 || len(reports["quiet"]) != 0 {
		t.Fatalf("reports %v, want one for hostile and none for quiet", reports)
	}
	// Within the cap again (most Pods gone): reported once, and answers whole.
	tb.ReplaceCluster("edge-a", append(amplifyPods("hostile", 2, 16, 20), small))
	ix = tb.Rebuild()
	if r := reports["hostile"]; len(r) != 2 || r[1].capped != 0 {
		t.Errorf("reports %v, want a second one with nothing capped", r)
	}
	if got := srvs(ix.Lookup("svc-3.hostile.svc."+zone, dns.TypeSRV)); len(got) != 2*20 {
		t.Errorf("svc-3 after the cap lifted: %d SRV records, want 40", len(got))
	}
}

// A capped namespace whose Pods all go is reported within the cap (0), as
// one whose Pods shrink is: the plugin deletes the namespace's capped_records
// series on that report, so it must come however the namespace empties.
func TestNamespaceGoneReportsUncapped(t *testing.T) {
	c := cfg()
	c.NamespaceRecords = 100
	tb := newTable(c)
	reports := map[string][]int{}
	tb.OnCapped(func(ns string, _, capped int) { reports[ns] = append(reports[ns], capped) })
	tb.ReplaceCluster("edge-a", append(amplifyPods("hostile", 20, 4, 4), amplifyPods("quiet", 1, 1, 1)...))
	tb.Rebuild()
	if r := reports["hostile"]; len(r) != 1 || r[0] <= 0 {
		t.Fatalf("reports %v, want hostile capped", reports)
	}
	tb.ReplaceCluster("edge-a", amplifyPods("quiet", 1, 1, 1))
	tb.Rebuild()
	if r := reports["hostile"]; len(r) != 2 || r[1] != 0 {
		t.Errorf("reports %v, want a second one for hostile with nothing capped", reports)
	}
	if len(reports["quiet"]) != 0 {
		t.Errorf("quiet reported: %v", reports)
	}
}

// BenchmarkAmplification is the attack of issue 26 item 1: 400 Pods, each
// exporting 64 services with 20 named ports, every SRV and A name asked.
// It reports the heap the rendered answers hold (B-heap), with no cap on a
// namespace's records and with the plugin's default cap, and the time a
// Ready flip of one Pod costs until every name answers again (each op).
func BenchmarkAmplification(b *testing.B) {
	for _, limit := range []int{0, 50000} {
		b.Run(fmt.Sprintf("namespace-records=%d", limit), func(b *testing.B) {
			c := cfg()
			c.NamespaceRecords = limit
			tb := newTable(c)
			pods := amplifyPods("hostile", 400, 64, 20)
			before := heap()
			tb.ReplaceCluster("edge-a", pods)
			ix := tb.Rebuild()
			askAll(b, ix, "hostile", 64, 20)
			held := heap() - before
			runtime.KeepAlive(ix)
			flip := *pods[7]
			for i := 0; b.Loop(); i++ {
				flip.Ready = i%2 == 0
				p := flip
				tb.Upsert(&p)
				ix = tb.Rebuild()
				for s := range 64 {
					ix.Lookup(fmt.Sprintf("svc-%d.hostile.svc.%s", s, zone), dns.TypeSRV)
				}
			}
			b.ReportMetric(float64(held), "B-heap")
		})
	}
}
