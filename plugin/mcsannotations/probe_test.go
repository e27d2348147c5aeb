package mcsannotations

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/probe"
)

func TestParseProbe(t *testing.T) {
	def := probe.Defaults(probe.Disconnected)
	all := probe.Defaults(probe.All)
	tests := []struct {
		input string
		err   string // substring of the error; "" for success
		want  *probe.Config
	}{
		{input: "mcsannotations {\n cluster a\n}"},
		{input: "mcsannotations {\n cluster a\n probe disconnected\n}", want: &def},
		{input: "mcsannotations {\n cluster a\n probe all tcp\n}", want: &all},
		{input: "mcsannotations {\n cluster a\n probe all http /healthz interval 5s timeout 500ms fails 3 passes 1\n}",
			want: &probe.Config{Mode: probe.All, Path: "/healthz", Interval: 5 * time.Second, Timeout: 500 * time.Millisecond, Fails: 3, Passes: 1, PortsPerAddress: 8}},
		{input: "mcsannotations {\n cluster a\n probe disconnected passes 4 fails 1 interval 1s timeout 1s\n}",
			want: &probe.Config{Mode: probe.Disconnected, Interval: time.Second, Timeout: time.Second, Fails: 1, Passes: 4, PortsPerAddress: 8}},
		{input: "mcsannotations {\n cluster a\n probe all deny 10.96.0.0/12 192.168.1.10/32 ::ffff:172.16.0.0/108 ports_per_address 2 allow 127.77.1.2/16 fails 3\n}",
			want: &probe.Config{Mode: probe.All, Interval: 2 * time.Second, Timeout: time.Second, Fails: 3, Passes: 2, PortsPerAddress: 2,
				Deny:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("192.168.1.10/32"), netip.MustParsePrefix("172.16.0.0/12")},
				Allow: []netip.Prefix{netip.MustParsePrefix("127.77.0.0/16")}}},
		{input: "mcsannotations {\n cluster a\n probe disconnected allow fd00::/8\n}",
			want: &probe.Config{Mode: probe.Disconnected, Interval: 2 * time.Second, Timeout: time.Second, Fails: 2, Passes: 2, PortsPerAddress: 8,
				Allow: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}}},
		// Errors.
		{input: "mcsannotations {\n cluster a\n probe\n}", err: ":3 - Error during parsing: probe takes disconnected or all first, then [tcp|http PATH]"},
		{input: "mcsannotations {\n cluster a\n probe tcp\n}", err: "probe takes disconnected or all first"},
		{input: "mcsannotations {\n cluster a\n probe some\n}", err: "probe takes disconnected or all first"},
		{input: "mcsannotations {\n cluster a\n probe all http\n}", err: ":3 - Error during parsing: probe http takes a PATH such as /healthz"},
		{input: "mcsannotations {\n cluster a\n probe all http healthz\n}", err: `probe http "healthz": the path must start with /`},
		{input: "mcsannotations {\n cluster a\n probe all tcp http /x\n}", err: "probe: http is given twice"},
		{input: "mcsannotations {\n cluster a\n probe all fails 2 fails 3\n}", err: "probe: fails is given twice"},
		{input: "mcsannotations {\n cluster a\n probe all interval\n}", err: "probe interval takes a value"},
		{input: "mcsannotations {\n cluster a\n probe all interval 2\n}", err: `probe interval "2": must be a duration of at least 100ms, such as 2s`},
		{input: "mcsannotations {\n cluster a\n probe all interval 10ms\n}", err: `probe interval "10ms": must be a duration of at least 100ms`},
		{input: "mcsannotations {\n cluster a\n probe all timeout -1s\n}", err: `probe timeout "-1s": must be a duration of at least 100ms`},
		{input: "mcsannotations {\n cluster a\n probe all timeout 3s\n}", err: "probe timeout 3s: must not be longer than the interval 2s"},
		{input: "mcsannotations {\n cluster a\n probe all fails 0\n}", err: `probe fails "0": must be a whole number from 1 to 100`},
		{input: "mcsannotations {\n cluster a\n probe all passes x\n}", err: `probe passes "x": must be a whole number from 1 to 100`},
		{input: "mcsannotations {\n cluster a\n probe all passes 101\n}", err: `probe passes "101": must be a whole number from 1 to 100`},
		{input: "mcsannotations {\n cluster a\n probe all udp\n}", err: `probe: unknown option "udp": want tcp, http PATH, interval, timeout, fails, passes, ports_per_address, deny CIDR... or allow CIDR...`},
		{input: "mcsannotations {\n cluster a\n probe all ports_per_address 0\n}", err: `probe ports_per_address "0": must be a whole number from 1 to 1024`},
		{input: "mcsannotations {\n cluster a\n probe all ports_per_address 1025\n}", err: `probe ports_per_address "1025": must be a whole number from 1 to 1024`},
		{input: "mcsannotations {\n cluster a\n probe all ports_per_address\n}", err: "probe ports_per_address takes a value"},
		{input: "mcsannotations {\n cluster a\n probe all deny\n}", err: ":3 - Error during parsing: probe deny takes one or more CIDRs such as 10.96.0.0/12"},
		{input: "mcsannotations {\n cluster a\n probe all allow fails 2\n}", err: "probe allow takes one or more CIDRs such as 10.96.0.0/12"},
		{input: "mcsannotations {\n cluster a\n probe all deny 10.96.0.1\n}", err: `probe deny "10.96.0.1": not a CIDR such as 10.96.0.0/12 or fd00::/8`},
		{input: "mcsannotations {\n cluster a\n probe all allow 127.0.0.0/8 every\n}", err: `probe allow "every": not a CIDR`},
		{input: "mcsannotations {\n cluster a\n probe all deny 10.0.0.0/8 deny 10.1.0.0/16\n}", err: "probe: deny is given twice"},
		{input: "mcsannotations {\n cluster a\n probe all every 2s\n}", err: `probe: unknown option "every"`},
		{input: "mcsannotations {\n cluster a\n probe all\n probe disconnected\n}", err: ":4 - Error during parsing: probe is given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			cfg, ok := parseCase(t, tc.input, tc.err)
			if !ok {
				return
			}
			if !reflect.DeepEqual(cfg.probe, tc.want) {
				t.Errorf("probe %+v, want %+v", cfg.probe, tc.want)
			}
		})
	}
}

// refuseDialer refuses connections to the addresses in down and accepts the
// others; it counts the dials of each address.
type refuseDialer struct {
	mu     sync.Mutex
	down   map[string]bool
	dialed map[string]int
}

func (d *refuseDialer) DialContext(_ context.Context, _, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dialed == nil {
		d.dialed = map[string]int{}
	}
	d.dialed[addr]++
	if d.down[addr] {
		return nil, errors.New("connection refused")
	}
	c, s := net.Pipe()
	s.Close()
	return c, nil
}

// probedMCS is testMCS with a prober whose dialer refuses d1 (db's only
// endpoint) and b4 (backend's edge-b endpoint).
func probedMCS(t testing.TB) *MCS {
	old := probeDialer
	probeDialer = &refuseDialer{down: map[string]bool{"10.1.0.9:5432": true, "10.1.0.4:8080": true}}
	t.Cleanup(func() { probeDialer = old })
	m := testMCS(false)
	cfg := probe.Defaults(probe.All)
	m.newProber(&cfg)
	m.table.Rebuild()
	return m
}

// Through the handler: a down endpoint leaves the answers, its name
// included; a service with every endpoint down answers them all, counted.
func TestServeDNSProbed(t *testing.T) {
	m := probedMCS(t)
	ctx := context.Background()
	ask := func(qname string, qtype uint16) {
		w := dnstest.NewRecorder(&test.ResponseWriter{})
		m.ServeDNS(ctx, w, (&test.Case{Qname: qname, Qtype: qtype}).Msg())
	}
	ask("backend.default.svc.clusterset.local.", dns.TypeA)
	ask("db.default.svc.clusterset.local.", dns.TypeA)
	for range 2 { // fails 2
		m.prober.Round(ctx)
	}
	m.table.Rebuild()
	before := testutil.ToFloat64(failOpenAnswers)
	cases := []test.Case{
		{Qname: "_http._tcp.backend.default.svc.clusterset.local.", Qtype: dns.TypeSRV, Answer: []dns.RR{
			test.SRV("_http._tcp.backend.default.svc.clusterset.local. 5 IN SRV 0 50 8080 10-0-0-1.edge-a.backend.default.svc.clusterset.local."),
			test.SRV("_http._tcp.backend.default.svc.clusterset.local. 5 IN SRV 0 50 8080 web-0.edge-a.backend.default.svc.clusterset.local."),
		}, Extra: []dns.RR{
			test.A("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.1"),
			test.AAAA("10-0-0-1.edge-a.backend.default.svc.clusterset.local. 5 IN AAAA fd00::1"),
			test.A("web-0.edge-a.backend.default.svc.clusterset.local. 5 IN A 10.0.0.2"),
		}},
		// b4 failed its probes: its own name is gone.
		{Qname: "10-1-0-4.edge-b.backend.default.svc.clusterset.local.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}},
		// db's only endpoint failed: fail open.
		{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("db.default.svc.clusterset.local. 5 IN A 10.1.0.9"),
		}},
		{Qname: "10-1-0-9.edge-b.db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.A("10-1-0-9.edge-b.db.default.svc.clusterset.local. 5 IN A 10.1.0.9"),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.Qname, func(t *testing.T) {
			w := dnstest.NewRecorder(&test.ResponseWriter{})
			if _, err := m.ServeDNS(ctx, w, tc.Msg()); err != nil {
				t.Fatal(err)
			}
			resp := w.Msg
			resp.Ns = fixSerial(resp.Ns)
			if err := test.SortAndCheck(resp, tc); err != nil {
				t.Error(err)
			}
		})
	}
	if got := testutil.ToFloat64(failOpenAnswers) - before; got != 2 {
		t.Errorf("fail_open_answers_total grew by %v, want 2 (db's two answers)", got)
	}
	down, probed := m.prober.Down()
	if down["edge-b"] != 2 || probed != 4 {
		t.Errorf("Down() = %v, %d; want edge-b 2 of 4 probed (b3 is not ready)", down, probed)
	}
}

// A Pod whose address is loopback or link-local (a tenant can name any) is
// never probed: it stays answered although a probe of it would fail, so
// the answers say nothing of what listens there; each is logged once and
// counted by reason.
func TestServeDNSProbeRefused(t *testing.T) {
	logs := captureLog(t)
	m := probedMCS(t)
	d := probeDialer.(*refuseDialer)
	d.mu.Lock()
	d.down["127.0.0.1:5432"], d.down["[::ffff:169.254.169.254]:5432"] = true, true // what a probe would find
	d.mu.Unlock()
	pg := annotation.Port{Name: "pg", Port: 5432, TargetPort: 5432, Protocol: "TCP"}
	addPod(m.records, "edge-b", "lo", "", true, []string{"127.0.0.1"}, annotation.Export{Name: "db", Ports: []annotation.Port{pg}})
	addPod(m.records, "edge-b", "meta", "", true, []string{"::ffff:169.254.169.254"}, annotation.Export{Name: "db", Ports: []annotation.Port{pg}})
	m.table.Rebuild()
	before := map[string]float64{}
	for _, r := range []string{"loopback", "link_local"} {
		before[r] = testutil.ToFloat64(probeRefused.WithLabelValues(r))
	}
	ctx := context.Background()
	m.ServeDNS(ctx, dnstest.NewRecorder(&test.ResponseWriter{}), (&test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA}).Msg())
	for range 3 {
		m.prober.Round(ctx)
	}
	m.table.Rebuild()
	// d1 (10.1.0.9) failed its probes; the two refused are answered as
	// without probing: no fail open.
	tc := test.Case{Qname: "db.default.svc.clusterset.local.", Qtype: dns.TypeA, Answer: []dns.RR{
		test.A("db.default.svc.clusterset.local. 5 IN A 127.0.0.1"),
		test.A("db.default.svc.clusterset.local. 5 IN A 169.254.169.254"),
	}}
	w := dnstest.NewRecorder(&test.ResponseWriter{})
	if _, err := m.ServeDNS(ctx, w, tc.Msg()); err != nil {
		t.Fatal(err)
	}
	if err := test.SortAndCheck(w.Msg, tc); err != nil {
		t.Error(err)
	}
	d.mu.Lock()
	if n := d.dialed["127.0.0.1:5432"] + d.dialed["[::ffff:169.254.169.254]:5432"] + d.dialed["169.254.169.254:5432"]; n != 0 {
		t.Errorf("refused targets dialed %d times (%v)", n, d.dialed)
	}
	d.mu.Unlock()
	for _, r := range []string{"loopback", "link_local"} {
		if got := testutil.ToFloat64(probeRefused.WithLabelValues(r)) - before[r]; got != 1 {
			t.Errorf("probe_targets_refused_total{reason=%q} grew by %v over three rounds, want 1", r, got)
		}
	}
	for _, want := range []string{
		"probe: service default/db: cluster edge-b Pod default/lo at 127.0.0.1:5432 is not probed: 127.0.0.1 is a loopback address; it stays in the answers as without probe",
		"at [::ffff:169.254.169.254]:5432 is not probed: ::ffff:169.254.169.254 is a link-local address",
	} {
		if n := strings.Count(logs(), want); n != 1 {
			t.Errorf("log has %d lines with %q, want 1:\n%s", n, want, logs())
		}
	}
}

// Each reason's series of probe_targets_refused_total exists from the start,
// so that an alert sees the first refusal as an increase.
func TestProbeRefusedSeries(t *testing.T) {
	got := series(t, "coredns_mcsannotations_probe_targets_refused_total")
	for _, r := range probe.Reasons {
		if _, ok := got[string(r)]; !ok {
			t.Errorf("probe_targets_refused_total{reason=%q}: no series", r)
		}
	}
}

// fixSerial sets an SOA's serial to 1, as the test's SOA has it.
func fixSerial(rrs []dns.RR) []dns.RR {
	for _, rr := range rrs {
		if s, ok := rr.(*dns.SOA); ok {
			s.Serial = 1
		}
	}
	return rrs
}

// Probing adds no allocation to an answer.
func TestServeDNSProbedAllocs(t *testing.T) {
	off := testMCS(false)
	on := probedMCS(t)
	ctx := context.Background()
	for _, q := range []benchQuery{
		{"A", "backend.default.svc.clusterset.local.", dns.TypeA},
		{"SRV", "_http._tcp.backend.default.svc.clusterset.local.", dns.TypeSRV},
		{"endpoint", "10-0-0-1.edge-a.backend.default.svc.clusterset.local.", dns.TypeA},
	} {
		req := (&test.Case{Qname: q.qname, Qtype: q.qtype}).Msg()
		w := &test.ResponseWriter{}
		want := testing.AllocsPerRun(100, func() { off.ServeDNS(ctx, w, req) })
		got := testing.AllocsPerRun(100, func() {
			on.ServeDNS(ctx, w, req)
			on.table.Asked(func(_, _ string) {}) // each run marks the service again
		})
		if got != want {
			t.Errorf("%s: %v allocations with probing, %v without", q.name, got, want)
		}
	}
}

// BenchmarkServeDNSProbe answers with probing off and on (a prober running
// rounds every 100 ms against a fake dialer, one endpoint down), in one run.
func BenchmarkServeDNSProbe(b *testing.B) {
	qs := []benchQuery{
		{"A", "backend.default.svc.clusterset.local.", dns.TypeA},
		{"SRV", "_http._tcp.backend.default.svc.clusterset.local.", dns.TypeSRV},
	}
	b.Run("probe=off", func(b *testing.B) { benchServe(b, testMCS(false), qs) })
	b.Run("probe=on", func(b *testing.B) {
		m := probedMCS(b)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go m.table.Run(ctx)
		cfg := m.prober.Config()
		cfg.Interval = 100 * time.Millisecond
		p := probe.New(m.table, cfg, probe.Options{Dialer: probeDialer})
		go p.Run(ctx)
		benchServe(b, m, qs)
	})
}
