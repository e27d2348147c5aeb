package mcsannotations

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
			want: &probe.Config{Mode: probe.All, Path: "/healthz", Interval: 5 * time.Second, Timeout: 500 * time.Millisecond, Fails: 3, Passes: 1}},
		{input: "mcsannotations {\n cluster a\n probe disconnected passes 4 fails 1 interval 1s timeout 1s\n}",
			want: &probe.Config{Mode: probe.Disconnected, Interval: time.Second, Timeout: time.Second, Fails: 1, Passes: 4}},
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
		{input: "mcsannotations {\n cluster a\n probe all udp\n}", err: `probe: unknown option "udp": want tcp, http PATH, interval, timeout, fails or passes`},
		{input: "mcsannotations {\n cluster a\n probe all every 2s\n}", err: `probe: unknown option "every"`},
		{input: "mcsannotations {\n cluster a\n probe all\n probe disconnected\n}", err: ":4 - Error during parsing: probe is given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			cfg, ok := parseCase(t, tc.input, tc.err)
			if !ok {
				return
			}
			if (cfg.probe == nil) != (tc.want == nil) || (cfg.probe != nil && *cfg.probe != *tc.want) {
				t.Errorf("probe %+v, want %+v", cfg.probe, tc.want)
			}
		})
	}
}

// refuseDialer refuses connections to the addresses in down and accepts the
// others.
type refuseDialer struct {
	mu   sync.Mutex
	down map[string]bool
}

func (d *refuseDialer) DialContext(_ context.Context, _, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
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
