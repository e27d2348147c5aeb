package mcsannotations

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// fakeContact is a source as the stale mark reads it.
type fakeContact struct {
	cluster       string
	state         source.State
	last, started time.Time
}

func (f *fakeContact) Cluster() string        { return f.cluster }
func (f *fakeContact) State() source.State    { return f.state }
func (f *fakeContact) LastContact() time.Time { return f.last }
func (f *fakeContact) Started() time.Time     { return f.started }

// staleNow is the time the stale tests run at.
var staleNow = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// withContacts makes m read its clusters' contact from cs, at staleNow.
func withContacts(m *MCS, cs ...*fakeContact) *MCS {
	m.stale.now = func() time.Time { return staleNow }
	m.stale.init(func() []contact {
		out := make([]contact, len(cs))
		for i, c := range cs {
			out[i] = c
		}
		return out
	})
	return m
}

// ede returns the text of the reply's Extended DNS Error 3, and whether it
// has one; any other EDE fails the test.
func ede(t *testing.T, m *dns.Msg) (string, bool) {
	t.Helper()
	opt := m.IsEdns0()
	if opt == nil {
		return "", false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			if e.InfoCode != dns.ExtendedErrorCodeStaleAnswer {
				t.Fatalf("EDE %d, want only %d (Stale Answer)", e.InfoCode, dns.ExtendedErrorCodeStaleAnswer)
			}
			return e.ExtraText, true
		}
	}
	return "", false
}

// serve asks m as CoreDNS's server does: through its ScrubWriter, which fits
// the reply to the client's buffer and sets its OPT from the query's.
func serve(t *testing.T, m *MCS, req *dns.Msg, tcp bool) *dns.Msg {
	t.Helper()
	rec := dnstest.NewRecorder(&test.ResponseWriter{TCP: tcp})
	if _, err := m.ServeDNS(context.Background(), request.NewScrubWriter(req, rec), req); err != nil {
		t.Fatal(err)
	}
	if rec.Msg == nil {
		t.Fatal("no answer written")
	}
	return rec.Msg
}

// An answer holding records of a cluster out of contact for longer than the
// grace carries EDE 3 naming the cluster and its age, when the query has
// EDNS0; the records themselves are answered as ever.
func TestStaleAnswerMarked(t *testing.T) {
	connected := &fakeContact{cluster: "edge-a", state: source.Connected, last: staleNow.Add(-time.Second), started: staleNow.Add(-time.Hour)}
	cut := &fakeContact{cluster: "edge-b", state: source.Disconnected, last: staleNow.Add(-(2*time.Minute + 14*time.Second)), started: staleNow.Add(-time.Hour)}
	justCut := &fakeContact{cluster: "edge-b", state: source.Disconnected, last: staleNow.Add(-3 * time.Second), started: staleNow.Add(-time.Hour)}
	// Restarted with a snapshot a minute ago, old contact: not marked during
	// the grace after the start, marked after it.
	restarting := &fakeContact{cluster: "edge-b", state: source.Syncing, last: staleNow.Add(-time.Hour), started: staleNow.Add(-2 * time.Second)}
	restarted := &fakeContact{cluster: "edge-b", state: source.Syncing, last: staleNow.Add(-time.Hour), started: staleNow.Add(-time.Minute)}
	neverContacted := &fakeContact{cluster: "edge-b", state: source.Disconnected, started: staleNow.Add(-time.Minute)}
	connectedB := &fakeContact{cluster: "edge-b", state: source.Connected, last: staleNow.Add(-time.Minute), started: staleNow.Add(-time.Hour)}

	db := []dns.RR{test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9")}
	edgeB := []dns.RR{test.A("10-1-0-4.edge-b.backend.default.svc.clusterset.local. 5 IN A 10.1.0.4")}
	backend := []dns.RR{
		test.A("backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"),
		test.A("backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
	}
	for _, c := range []struct {
		name   string
		b      *fakeContact
		tc     test.Case
		edns   bool
		ede    string // "": none
		counts float64
	}{
		{"stale peer, EDNS0", cut, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, true, "stale: edge-b 2m14s", 1},
		{"stale peer, no EDNS0", cut, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, false, "", 1},
		{"stale endpoint name", cut, test.Case{Qname: "10-1-0-4.edge-b.backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: edgeB}, true, "stale: edge-b 2m14s", 1},
		{"stale SRV", cut, test.Case{Qname: "_pg._tcp.db.default.svc.clusterset.local.", Qtype: dns.TypeSRV,
			Answer: []dns.RR{test.SRV("_pg._tcp.db.default.svc.clusterset.local. 5 IN SRV 0 100 5432 10-1-0-9.edge-b.db.default.svc.clusterset.local.")},
			Extra:  []dns.RR{test.OPT(4096, true), test.A("10-1-0-9.edge-b.db.default.svc.clusterset.local. 5 IN A 10.1.0.9")}}, true, "stale: edge-b 2m14s", 1},
		// The local cluster's endpoints alone (locality): nothing of edge-b.
		{"answer of connected clusters only", cut, test.Case{Qname: "backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: backend}, true, "", 0},
		{"within the grace after a cut", justCut, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, true, "", 0},
		{"within the grace after a restart", restarting, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, true, "", 0},
		{"past the grace after a restart", restarted, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, true, "stale: edge-b 1h0m0s", 1},
		{"never contacted", neverContacted, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, true, "stale: edge-b", 1},
		{"connected peer", connectedB, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: db}, true, "", 0},
		{"NODATA names no cluster", cut, test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeAAAA, Ns: []dns.RR{test.SOA(soa)}}, true, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := withContacts(testMCS(false), connected, c.b)
			req := c.tc.Msg()
			if c.edns {
				req.SetEdns0(4096, true)
			}
			before := series(t, "coredns_mcsannotations_stale_answers_total")["edge-b"]
			got := serve(t, m, req, false)
			text, has := ede(t, got)
			if has != (c.ede != "") || text != c.ede {
				t.Errorf("EDE %q (present %t), want %q", text, has, c.ede)
			}
			if !c.edns && got.IsEdns0() != nil {
				t.Errorf("a reply to a query without EDNS0 has an OPT record: %v", got.IsEdns0())
			}
			if c.tc.Extra == nil && c.edns {
				c.tc.Extra = []dns.RR{test.OPT(4096, true)}
			}
			if err := test.SortAndCheck(got, c.tc); err != nil {
				t.Error(err)
			}
			if n := series(t, "coredns_mcsannotations_stale_answers_total")["edge-b"] - before; n != c.counts {
				t.Errorf("stale_answers_total{cluster=edge-b} rose by %v, want %v", n, c.counts)
			}
		})
	}
}

// wideMCS is a handler over one service, wide, with one endpoint in each of
// clusters clusters named long enough that their list would not fit the
// EXTRA-TEXT bound, and perPeer addresses in each; every cluster is out of
// contact.
func wideMCS(clusters, perPeer int) *MCS {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "local", Locality: table.Any})
	var cs []*fakeContact
	for c := range clusters {
		name := fmt.Sprintf("edge-%02d-with-a-rather-long-cluster-name", c)
		var ips []string
		for i := range perPeer {
			ips = append(ips, fmt.Sprintf("10.%d.%d.%d", c, i/250, i%250+1))
		}
		addPod(tb, name, fmt.Sprintf("w%d", c), "", true, ips, annotation.Export{Name: "wide"})
		cs = append(cs, &fakeContact{cluster: name, state: source.Disconnected, last: staleNow.Add(-time.Duration(c+1) * time.Hour), started: staleNow.Add(-48 * time.Hour)})
	}
	tb.Rebuild()
	return withContacts(&MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}, cs...)
}

// Many stale clusters: the EXTRA-TEXT names the first few and counts the
// others, within its bound; each is counted in the metric.
func TestStaleAnswerManyClusters(t *testing.T) {
	m := wideMCS(20, 1)
	req := new(dns.Msg)
	req.SetQuestion("wide.default.svc.clusterset.local.", dns.TypeA)
	req.SetEdns0(4096, false)
	before := series(t, "coredns_mcsannotations_stale_answers_total")
	got := serve(t, m, req, false)
	if len(got.Answer) != 20 {
		t.Errorf("%d answers, want 20", len(got.Answer))
	}
	text, _ := ede(t, got)
	if len(text) > table.MaxEDEText || !strings.HasPrefix(text, "stale: edge-00-with-a-rather-long-cluster-name 1h0m0s") || !strings.HasSuffix(text, " more") {
		t.Errorf("EXTRA-TEXT %q (%d octets): want the first clusters, then a count, within %d octets", text, len(text), table.MaxEDEText)
	}
	named := strings.Count(text, "-with-a-rather-long-cluster-name")
	if want := fmt.Sprintf(" +%d more", 20-named); named == 0 || !strings.HasSuffix(text, want) {
		t.Errorf("EXTRA-TEXT %q names %d clusters, want it to end %q", text, named, want)
	}
	after := series(t, "coredns_mcsannotations_stale_answers_total")
	for c := range 20 {
		name := fmt.Sprintf("edge-%02d-with-a-rather-long-cluster-name", c)
		if n := after[name] - before[name]; n != 1 {
			t.Errorf("stale_answers_total{cluster=%s} rose by %v, want 1", name, n)
		}
	}
}

// The EXTRA-TEXT bound holds for any number of clusters and any name length.
func TestStaleTextBounded(t *testing.T) {
	for _, c := range []struct {
		clusters, nameLen int
		want              string
	}{
		{1, 6, "stale: cccccc 1h0m0s"},
		{3, 6, "stale: cccccc 1h0m0s, cccccc 1h0m0s, cccccc 1h0m0s"},
		{4, 6, "stale: cccccc 1h0m0s, cccccc 1h0m0s, cccccc 1h0m0s +1 more"},
		{2, 63, "stale: " + strings.Repeat("c", 63) + " 1h0m0s +1 more"},
		{1, 200, "stale: +1 more"},
		{100000, 1, "stale: c 1h0m0s, c 1h0m0s, c 1h0m0s +99997 more"},
	} {
		var text staleText
		for range c.clusters {
			text.add(strings.Repeat("c", c.nameLen), time.Hour)
		}
		if got := text.String(); got != c.want || len(got) > table.MaxEDEText {
			t.Errorf("%d clusters named %d octets: %q (%d octets), want %q", c.clusters, c.nameLen, got, len(got), c.want)
		}
	}
}

// A cluster whose name does not fit is counted, and the next one is named
// as if it came first.
func TestStaleTextSkipsUnfitting(t *testing.T) {
	var text staleText
	text.add(strings.Repeat("c", 200), time.Hour)
	text.add("edge-b", time.Hour)
	if got, want := text.String(), "stale: edge-b 1h0m0s +1 more"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// A stale reply too large for the client's UDP buffer is truncated as any
// other, its Extended DNS Error kept and counted in the size; without EDNS0
// the truncated reply has no OPT record.
func TestStaleAnswerTruncated(t *testing.T) {
	m := wideMCS(2, 100) // 200 A records: 3,200 octets and more
	for _, c := range []struct {
		bufsize uint16 // 0: no EDNS0
		tcp     bool
	}{{1232, false}, {512, false}, {0, false}, {0, true}, {4096, true}} {
		t.Run(fmt.Sprintf("bufsize %d tcp %t", c.bufsize, c.tcp), func(t *testing.T) {
			req := new(dns.Msg)
			req.SetQuestion("wide.default.svc.clusterset.local.", dns.TypeA)
			if c.bufsize > 0 {
				req.SetEdns0(c.bufsize, false)
			}
			got := serve(t, m, req, c.tcp)
			b, err := got.Pack()
			if err != nil {
				t.Fatal(err)
			}
			limit := dns.MinMsgSize
			if c.bufsize > 0 {
				limit = int(c.bufsize)
			}
			if c.tcp {
				limit = dns.MaxMsgSize
			}
			if len(b) > limit {
				t.Errorf("reply of %d octets, over %d", len(b), limit)
			}
			if got.Truncated == c.tcp || (c.tcp && len(got.Answer) != 200) {
				t.Errorf("truncated %t with %d answers, want %t", got.Truncated, len(got.Answer), !c.tcp)
			}
			text, has := ede(t, got)
			if c.bufsize > 0 && (!has || !strings.HasPrefix(text, "stale: edge-00")) {
				t.Errorf("EDE %q (present %t), want the stale clusters", text, has)
			}
			if c.bufsize == 0 && got.IsEdns0() != nil {
				t.Errorf("a reply to a query without EDNS0 has an OPT record")
			}
		})
	}
}

// While every source is connected, and while only sources the answer holds
// nothing of are not, the mark allocates nothing.
func TestStaleMarkDoesNotAllocate(t *testing.T) {
	for _, b := range []source.State{source.Connected, source.Disconnected} {
		m := withContacts(testMCS(false),
			&fakeContact{cluster: "edge-a", state: source.Connected, last: staleNow},
			&fakeContact{cluster: "edge-b", state: b, last: staleNow.Add(-time.Hour)})
		req := new(dns.Msg)
		req.SetQuestion("backend.default.svc.clusterset.local.", dns.TypeA)
		req.SetEdns0(4096, false)
		msg := new(dns.Msg)
		if n := testing.AllocsPerRun(100, func() { m.markStale(msg, req, []string{"edge-a"}) }); n != 0 {
			t.Errorf("edge-b %s: %v allocations", b, n)
		}
	}
}

// dropAndKeep is a store and table with edge-b's endpoints of drop30 (drop after
// 30 s) and keep (the default).
func dropAndKeep() testTable {
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
	drop := annotation.Export{Name: "drop30"}
	drop.StaleEndpoints, drop.StaleGraceSeconds = annotation.StaleDrop, 30
	addPod(tb, "edge-b", "d1", "", true, []string{"10.1.0.1"}, drop)
	addPod(tb, "edge-b", "k1", "", true, []string{"10.1.0.2"}, annotation.Export{Name: "keep"})
	tb.Rebuild()
	return tb
}

// The exporter's stale policy in the answers: edge-b exports drop30 (drop
// after 30 s) and keep (the default). Cut for 20 s, both answer, marked
// stale; cut for 2 minutes, drop30 no longer has edge-b's endpoint (no
// endpoint left: NXDOMAIN) while keep still answers, marked; in contact
// again, both answer unmarked.
func TestStalePolicyAnswers(t *testing.T) {
	tb := dropAndKeep()
	b := &fakeContact{cluster: "edge-b", state: source.Connected, last: staleNow, started: staleNow.Add(-time.Hour)}
	m := withContacts(&MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}, b)

	dropA := []dns.RR{test.A("drop30.default.svc.clusterset.local. 5 IN A 10.1.0.1")}
	keepA := []dns.RR{test.A("keep.default.svc.clusterset.local. 5 IN A 10.1.0.2")}
	for _, step := range []struct {
		name  string
		state source.State
		cut   time.Duration // before staleNow
		drop  test.Case
		ede   string
	}{
		{"cut for 20s", source.Disconnected, 20 * time.Second,
			test.Case{Qname: "drop30.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: dropA}, "stale: edge-b 20s"},
		{"cut for 2m", source.Disconnected, 2 * time.Minute,
			test.Case{Qname: "drop30.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}}, "stale: edge-b 2m0s"},
		{"in contact again", source.Connected, 0,
			test.Case{Qname: "drop30.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: dropA}, ""},
	} {
		t.Run(step.name, func(t *testing.T) {
			b.state, b.last = step.state, staleNow.Add(-step.cut)
			m.applyStalePolicies(staleNow)
			tb.Rebuild()
			keep := test.Case{Qname: "keep.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: keepA}
			for _, tc := range []test.Case{step.drop, keep} {
				got := serve(t, m, tc.Msg(), false)
				if err := test.SortAndCheck(got, tc); err != nil {
					t.Errorf("%s: %v", tc.Qname, err)
				}
				req := tc.Msg()
				req.SetEdns0(4096, false)
				text, _ := ede(t, serve(t, m, req, false))
				want := step.ede
				if len(tc.Answer) == 0 {
					want = "" // no record, nothing stale
				}
				if text != want {
					t.Errorf("%s: EDE %q, want %q", tc.Qname, text, want)
				}
			}
		})
	}
}

// After a restart while cut, a cluster the snapshot recorded as
// disconnected is stale from the first answer (marked, its endpoints
// dropped where the exporter said so), its age counted from the contact
// before the cut; one recorded connected (or by a build that did not record
// the state) gets the 5 s grace after the start, as a restart that is about
// to reconnect.
func TestStaleAfterRestartWhileCut(t *testing.T) {
	for _, c := range []struct {
		recorded string
		stale    bool
	}{
		{"disconnected", true},
		{"connected", false},
		{"syncing", false},
		{"", false},
	} {
		t.Run(fmt.Sprintf("recorded %q", c.recorded), func(t *testing.T) {
			tb := dropAndKeep()
			// Started a second ago; the last contact, from the snapshot, 2 minutes ago.
			b := &fakeContact{cluster: "edge-b", state: source.Syncing, last: staleNow.Add(-2 * time.Minute), started: staleNow.Add(-time.Second)}
			m := withContacts(&MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}, b)
			m.staleState().seedLost("edge-b", c.recorded)
			m.staleState().seedLost("edge-z", "disconnected") // no such source: nothing
			m.applyStalePolicies(staleNow)
			tb.Rebuild()

			dropCase := test.Case{Qname: "drop30.default.svc.clusterset.local.", Qtype: dns.TypeA,
				Answer: []dns.RR{test.A("drop30.default.svc.clusterset.local. 5 IN A 10.1.0.1")}}
			mark := ""
			if c.stale {
				dropCase = test.Case{Qname: "drop30.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}}
				mark = "stale: edge-b 2m0s"
			}
			if err := test.SortAndCheck(serve(t, m, dropCase.Msg(), false), dropCase); err != nil {
				t.Errorf("drop30: %v", err)
			}
			req := new(dns.Msg)
			req.SetQuestion("keep.default.svc.clusterset.local.", dns.TypeA)
			req.SetEdns0(4096, false)
			if text, _ := ede(t, serve(t, m, req, false)); text != mark {
				t.Errorf("keep: EDE %q, want %q", text, mark)
			}
		})
	}
}
