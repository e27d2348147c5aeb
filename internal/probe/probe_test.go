package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

const zone = "clusterset.local."

// fakeDialer answers dials from a set of addresses that are up, and counts
// dials per address and how many ran at once.
type fakeDialer struct {
	mu       sync.Mutex
	up       map[string]bool
	dials    map[string]int
	inflight int
	most     int
	hold     chan struct{} // when set, each dial waits on it
}

var errRefused = errors.New("connection refused")

func newDialer(up ...string) *fakeDialer {
	d := &fakeDialer{up: map[string]bool{}, dials: map[string]int{}}
	for _, a := range up {
		d.up[a] = true
	}
	return d
}

func (d *fakeDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dials[addr]++
	d.inflight++
	d.most = max(d.most, d.inflight)
	up, hold := d.up[addr], d.hold
	d.mu.Unlock()
	defer func() { d.mu.Lock(); d.inflight--; d.mu.Unlock() }()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if network != "tcp" || !up {
		return nil, errRefused
	}
	c, s := net.Pipe()
	s.Close()
	return c, nil
}

func (d *fakeDialer) set(addr string, up bool) {
	d.mu.Lock()
	d.up[addr] = up
	d.mu.Unlock()
}

func (d *fakeDialer) count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[addr]
}

func (d *fakeDialer) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.dials {
		n += c
	}
	return n
}

var httpPort = annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}

// testTable is a record store and the DNS table over it: a test writes
// records to the store, the prober reads and marks the table.
type testTable struct {
	*table.Table
	*store.Store
}

func newTable() testTable {
	st := store.New()
	return testTable{table.New(table.Config{Zone: zone, TTL: 5, LocalCluster: "edge-a"}, st), st}
}

func mkpod(cluster, name, ip string, ready bool, svcs ...string) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: "default"}, Name: name, Ready: ready,
		IPs: []netip.Addr{netip.MustParseAddr(ip)}}
	for _, s := range svcs {
		p.Exports = append(p.Exports, annotation.Export{Name: s, Namespace: "default", Cluster: cluster, Ports: []annotation.Port{httpPort}})
	}
	return p
}

// env is a table, a fake dialer and clock, and a prober over them.
type env struct {
	t       *testing.T
	tbl     testTable
	dialer  *fakeDialer
	clk     *testingclock.FakeClock
	p       *Prober
	changes []Change
	probes  map[bool]int
}

func newEnv(t *testing.T, cfg Config, opts Options, pods ...*store.Pod) *env {
	e := &env{t: t, tbl: newTable(), dialer: newDialer(),
		clk: testingclock.NewFakeClock(time.Unix(1_700_000_000, 0)), probes: map[bool]int{}}
	for _, p := range pods {
		e.tbl.Upsert(p)
		e.dialer.set(netip.AddrPortFrom(p.IPs[0], 8080).String(), true)
	}
	e.tbl.TrackDemand()
	e.tbl.Rebuild()
	opts.Dialer, opts.Clock = e.dialer, e.clk
	opts.Events = Events{Probed: func(up bool) { e.probes[up]++ }, Changed: func(c Change) { e.changes = append(e.changes, c) }}
	e.p = New(e.tbl, cfg, opts)
	return e
}

// ask looks the service up, as a query does.
func (e *env) ask(name string) table.Answer {
	return e.tbl.Index().Lookup(name+".default.svc."+zone, dns.TypeA)
}

// answer is the service's A answer after the rebuild, without marking it asked.
func (e *env) answer(name string) (addrs []string, failOpen bool) {
	e.tbl.Rebuild()
	a := e.ask(name)
	e.tbl.Asked(func(_, _ string) {}) // this look was the test's, not a client's
	for _, r := range a.A {
		addrs = append(addrs, r.A.String())
	}
	slices.Sort(addrs)
	return addrs, a.FailOpen
}

func (e *env) round() {
	e.t.Helper()
	e.p.Round(context.Background())
}

func (e *env) wantAnswer(step, name string, want []string, failOpen bool) {
	e.t.Helper()
	got, fo := e.answer(name)
	if !slices.Equal(got, want) || fo != failOpen {
		e.t.Errorf("%s: %s answers %v (fail open %v), want %v (fail open %v)", step, name, got, fo, want, failOpen)
	}
}

// An endpoint leaves after Fails failed probes in a row and returns after
// Passes successes; every endpoint down answers all (fail open).
func TestDownAndBack(t *testing.T) {
	e := newEnv(t, Defaults(All), Options{},
		mkpod("edge-b", "b1", "10.1.0.1", true, "backend"), mkpod("edge-b", "b2", "10.1.0.2", true, "backend"))
	both := []string{"10.1.0.1", "10.1.0.2"}
	e.ask("backend")
	e.round()
	e.wantAnswer("all up", "backend", both, false)

	e.dialer.set("10.1.0.1:8080", false)
	e.round()
	e.wantAnswer("one failure", "backend", both, false)
	e.round()
	e.wantAnswer("two failures", "backend", []string{"10.1.0.2"}, false)
	if down, probed := e.p.Down(); down["edge-b"] != 1 || probed != 2 {
		t.Errorf("Down() = %v, %d; want edge-b 1, 2 probed", down, probed)
	}

	e.dialer.set("10.1.0.2:8080", false)
	e.round()
	e.round()
	e.wantAnswer("all down", "backend", both, true)

	e.dialer.set("10.1.0.1:8080", true)
	e.round()
	e.wantAnswer("one pass", "backend", both, true)
	e.round()
	e.wantAnswer("two passes", "backend", []string{"10.1.0.1"}, false)

	e.dialer.set("10.1.0.2:8080", true)
	e.round()
	e.round()
	e.wantAnswer("all back", "backend", both, false)
	if down, _ := e.p.Down(); len(down) != 0 {
		t.Errorf("Down() = %v after all came back", down)
	}
	if e.probes[true] == 0 || e.probes[false] != 8 {
		t.Errorf("probes %v, want 8 failed (b1's 4, b2's 4)", e.probes)
	}
	var log []string
	for _, c := range e.changes {
		log = append(log, fmt.Sprintf("%s %v", c.Endpoint.Pod.Name, c.Down))
	}
	if want := []string{"b1 true", "b2 true", "b1 false", "b2 false"}; !slices.Equal(log, want) {
		t.Errorf("changes %v, want %v", log, want)
	}
}

// Custom thresholds: fails 1 takes an endpoint out at the first failure,
// passes 3 needs three successes.
func TestThresholds(t *testing.T) {
	cfg := Defaults(All)
	cfg.Fails, cfg.Passes = 1, 3
	e := newEnv(t, cfg, Options{}, mkpod("edge-b", "b1", "10.1.0.1", true, "backend"), mkpod("edge-b", "b2", "10.1.0.2", true, "backend"))
	e.ask("backend")
	e.dialer.set("10.1.0.1:8080", false)
	e.round()
	e.wantAnswer("one failure", "backend", []string{"10.1.0.2"}, false)
	e.dialer.set("10.1.0.1:8080", true)
	e.round()
	e.round()
	e.wantAnswer("two passes", "backend", []string{"10.1.0.2"}, false)
	e.round()
	e.wantAnswer("three passes", "backend", []string{"10.1.0.1", "10.1.0.2"}, false)
}

// Only services asked within the window are probed; a service no longer
// asked is dropped, and its down endpoints return to the answers.
func TestDemand(t *testing.T) {
	e := newEnv(t, Defaults(All), Options{Window: time.Minute},
		mkpod("edge-b", "b1", "10.1.0.1", true, "backend"), mkpod("edge-b", "b2", "10.1.0.2", true, "backend"),
		mkpod("edge-b", "q1", "10.1.0.9", true, "quiet"))
	e.round()
	if n := e.dialer.total(); n != 0 {
		t.Fatalf("%d dials with nothing asked", n)
	}
	e.ask("backend")
	e.dialer.set("10.1.0.1:8080", false)
	e.round()
	e.round()
	if e.dialer.count("10.1.0.9:8080") != 0 {
		t.Error("the service nobody asked for was probed")
	}
	e.wantAnswer("b1 down", "backend", []string{"10.1.0.2"}, false)

	e.clk.Step(30 * time.Second)
	e.round()
	e.wantAnswer("within the window", "backend", []string{"10.1.0.2"}, false)
	before := e.dialer.total()
	e.clk.Step(31 * time.Second)
	e.round()
	if n := e.dialer.total(); n != before {
		t.Errorf("%d dials after the window", n-before)
	}
	e.wantAnswer("after the window", "backend", []string{"10.1.0.1", "10.1.0.2"}, false)
	if down, probed := e.p.Down(); len(down) != 0 || probed != 0 {
		t.Errorf("Down() = %v, %d after the window", down, probed)
	}
	if c := e.changes[len(e.changes)-1]; c.Down || c.Reason != "no longer probed: its service was not asked for 1m0s" {
		t.Errorf("last change %+v", c)
	}
}

// In disconnected mode a connected cluster's endpoints are never probed;
// when a stale cluster reconnects, its endpoints' marks are dropped.
func TestDisconnectedMode(t *testing.T) {
	var mu sync.Mutex
	stale := map[string]bool{"edge-b": true}
	e := newEnv(t, Defaults(Disconnected), Options{Stale: func(c string) bool { mu.Lock(); defer mu.Unlock(); return stale[c] }},
		mkpod("edge-a", "a1", "10.0.0.1", true, "backend"), mkpod("edge-b", "b1", "10.1.0.1", true, "backend"),
		mkpod("edge-b", "b2", "10.1.0.2", true, "backend"))
	e.ask("backend")
	e.dialer.set("10.1.0.1:8080", false)
	e.dialer.set("10.0.0.1:8080", false) // would go down if probed
	e.round()
	e.round()
	if n := e.dialer.count("10.0.0.1:8080"); n != 0 {
		t.Errorf("the connected cluster's endpoint was dialed %d times", n)
	}
	// prefer-local: edge-a answers the service name; b1's own name is gone.
	e.tbl.Rebuild()
	if a := e.tbl.Index().Lookup("10-1-0-1.edge-b.backend.default.svc."+zone, dns.TypeA); a.Kind != table.KindNXDomain {
		t.Errorf("b1's name: %s, want nxdomain", a.Kind)
	}
	if a := e.tbl.Index().LookupService("default", "backend", "edge-b", "", dns.TypeA); len(a.A) != 1 || a.A[0].A.String() != "10.1.0.2" {
		t.Errorf("edge-b's endpoints: %v, want 10.1.0.2", a.A)
	}
	mu.Lock()
	stale["edge-b"] = false
	mu.Unlock()
	before := e.dialer.total()
	e.round()
	if n := e.dialer.total(); n != before {
		t.Errorf("%d dials after edge-b reconnected", n-before)
	}
	e.tbl.Rebuild()
	if a := e.tbl.Index().Lookup("10-1-0-1.edge-b.backend.default.svc."+zone, dns.TypeA); a.Kind != table.KindEndpoint {
		t.Errorf("b1's name after the reconnect: %s, want it back (its Ready condition counts)", a.Kind)
	}
	if c := e.changes[len(e.changes)-1]; c.Down || c.Reason != "no longer probed: cluster edge-b is connected: its Ready conditions count again" {
		t.Errorf("last change %+v", c)
	}
}

// Endpoints with no TCP port, not ready or without an IP are not probed; a
// changed address starts over.
func TestWhatIsProbed(t *testing.T) {
	udp := mkpod("edge-b", "u1", "10.1.0.5", true)
	udp.Exports = []annotation.Export{{Name: "dns", Namespace: "default", Cluster: "edge-b",
		Ports: []annotation.Port{{Name: "dns", Port: 53, TargetPort: 53, Protocol: "UDP"}}}}
	e := newEnv(t, Defaults(All), Options{}, udp, mkpod("edge-b", "n1", "10.1.0.6", false, "backend"),
		mkpod("edge-b", "b1", "10.1.0.1", true, "backend"), mkpod("edge-b", "b2", "10.1.0.2", true, "backend"))
	e.ask("dns")
	e.ask("backend")
	e.round()
	if n := e.dialer.count("10.1.0.5:53") + e.dialer.count("10.1.0.5:8080"); n != 0 {
		t.Error("a UDP-only endpoint was probed")
	}
	if n := e.dialer.count("10.1.0.6:8080"); n != 0 {
		t.Error("a Pod that is not ready was probed")
	}
	e.dialer.set("10.1.0.1:8080", false)
	e.round()
	e.round()
	e.wantAnswer("b1 down", "backend", []string{"10.1.0.2"}, false)
	// b1 comes back at another address: no longer the endpoint that failed.
	e.tbl.Upsert(mkpod("edge-b", "b1", "10.1.0.3", true, "backend"))
	e.dialer.set("10.1.0.3:8080", true)
	e.tbl.Rebuild()
	e.round()
	e.wantAnswer("b1 moved", "backend", []string{"10.1.0.2", "10.1.0.3"}, false)
	if e.dialer.count("10.1.0.3:8080") != 1 {
		t.Error("the new address was not probed")
	}
}

// At most Workers probes run at once, and a stop ends a round without
// counting its cut-short probes as failures.
func TestWorkersAndStop(t *testing.T) {
	var pods []*store.Pod
	for i := range 20 {
		pods = append(pods, mkpod("edge-b", fmt.Sprintf("b%d", i), fmt.Sprintf("10.1.0.%d", i+1), true, "backend"))
	}
	e := newEnv(t, Defaults(All), Options{Workers: 3}, pods...)
	e.ask("backend")
	hold := make(chan struct{})
	e.dialer.hold = hold
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.p.Round(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for e.dialer.total() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the round did not end after the stop")
	}
	if e.dialer.most > 3 {
		t.Errorf("%d probes at once, want at most 3", e.dialer.most)
	}
	if len(e.probes) != 0 {
		t.Errorf("probes %v recorded from a stopped round", e.probes)
	}
	close(hold)
}

// State changes are reported at most ten at once, then about one a second,
// with a count of those left out.
func TestChangesRateLimited(t *testing.T) {
	cfg := Defaults(All)
	cfg.Fails = 1
	var pods []*store.Pod
	for i := range 30 {
		pods = append(pods, mkpod("edge-b", fmt.Sprintf("b%02d", i), fmt.Sprintf("10.1.0.%d", i+1), true, "backend"))
	}
	pods = append(pods, mkpod("edge-b", "last", "10.1.1.1", true, "backend"))
	e := newEnv(t, cfg, Options{}, pods...)
	e.ask("backend")
	for i := range 30 {
		e.dialer.set(fmt.Sprintf("10.1.0.%d:8080", i+1), false)
	}
	e.round()
	if len(e.changes) != 10 {
		t.Fatalf("%d changes reported at once, want 10", len(e.changes))
	}
	if down, _ := e.p.Down(); down["edge-b"] != 30 {
		t.Errorf("Down() = %v, want 30 (all applied, whether reported or not)", down)
	}
	e.clk.Step(2 * time.Second)
	e.dialer.set("10.1.1.1:8080", false)
	e.round()
	if len(e.changes) != 11 || e.changes[10].Suppressed != 20 {
		t.Errorf("%d changes, the last %+v; want 11, the last with 20 left out", len(e.changes), e.changes[len(e.changes)-1])
	}
}

// Run probes at once, then each interval on the clock.
func TestRun(t *testing.T) {
	e := newEnv(t, Defaults(All), Options{}, mkpod("edge-b", "b1", "10.1.0.1", true, "backend"))
	e.ask("backend")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.p.Run(ctx); close(done) }()
	waitFor := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for e.dialer.count("10.1.0.1:8080") < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d probes, want %d", e.dialer.count("10.1.0.1:8080"), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(1)
	for i := 2; i <= 4; i++ {
		deadline := time.Now().Add(5 * time.Second)
		for !e.clk.HasWaiters() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		e.clk.Step(1500 * time.Millisecond) // less than the interval: nothing
		time.Sleep(10 * time.Millisecond)
		if n := e.dialer.count("10.1.0.1:8080"); n != i-1 {
			t.Fatalf("%d probes before the interval passed, want %d", n, i-1)
		}
		e.clk.Step(800 * time.Millisecond) // 2.3 s: past the interval and its jitter
		waitFor(i)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}

// HTTP probes: 2xx and 3xx are up, other statuses and refusals down.
func TestHTTP(t *testing.T) {
	status := map[string]int{"/ok": 200, "/moved": 302, "/broken": 500}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status[r.URL.Path])
	}))
	defer srv.Close()
	addr := netip.MustParseAddrPort(srv.Listener.Addr().String())
	closed := refused(t)
	for _, tc := range []struct {
		path string
		addr netip.AddrPort
		up   bool
	}{
		{"/ok", addr, true}, {"/moved", addr, true}, {"/broken", addr, false}, {"/ok", closed, false},
	} {
		cfg := Defaults(All)
		cfg.Path = tc.path
		p := New(nil, cfg, Options{})
		err := p.probe(context.Background(), tc.addr)
		if (err == nil) != tc.up {
			t.Errorf("GET %s on %s: %v, want up %v", tc.path, tc.addr, err, tc.up)
		}
	}
}

// The TCP probe with the default dialer (HTTP probes use it, and TCP probes
// where connectAll is not): a listener is up, a closed port is down, the
// probe closes with a FIN, and its socket has neither SO_LINGER (a close
// that waits for the FIN's acknowledgement) nor keep-alive.
func TestTCPProbeDefaultDialer(t *testing.T) {
	ln, closedBy := readOnce(t)
	p := New(nil, Defaults(All), Options{})
	if err := p.probe(context.Background(), netip.MustParseAddrPort(ln.Addr().String())); err != nil {
		t.Fatalf("probe of a listener: %v", err)
	}
	if err := <-closedBy; !errors.Is(err, io.EOF) {
		t.Errorf("the listener read %v after the probe closed, want EOF (a FIN)", err)
	}
	down := refused(t)
	if err := p.probe(context.Background(), down); err == nil {
		t.Errorf("probe of a closed port %s: up, want down", down)
	}

	nd, ok := p.opts.Dialer.(*net.Dialer) // the dialer New installs
	if !ok {
		t.Fatalf("the default dialer is a %T, want a *net.Dialer", p.opts.Dialer)
	}
	c, err := nd.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var l *unix.Linger
	var ka int
	if err := raw.Control(func(fd uintptr) {
		l, err = unix.GetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER)
		if err == nil {
			ka, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		}
	}); err != nil || l == nil {
		t.Fatalf("SO_LINGER, SO_KEEPALIVE: %v", err)
	}
	if l.Onoff != 0 {
		t.Errorf("SO_LINGER %+v, want off", *l)
	}
	if ka != 0 {
		t.Errorf("SO_KEEPALIVE %d, want off", ka)
	}
}

// readOnce is a listener that accepts one connection and reads from it:
// closedBy gets the read's error (io.EOF after a FIN).
func readOnce(t *testing.T) (ln net.Listener, closedBy chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	closedBy = make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			closedBy <- err
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		closedBy <- err
	}()
	return ln, closedBy
}

// acceptClose is a listener on 127.0.0.1 that accepts connections and
// closes them at once, until the test ends.
func acceptClose(tb testing.TB) netip.AddrPort {
	tb.Helper()
	return acceptCloseOn(tb, netip.AddrFrom4([4]byte{127, 0, 0, 1}))
}

// acceptCloseOn is acceptClose on ip (of 127.0.0.0/8), at a free port.
func acceptCloseOn(tb testing.TB, ip netip.Addr) netip.AddrPort {
	tb.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// onLoopback is cfg with 127.0.0.0/8 allowed: the tests' listeners are
// there, and loopback is refused by default.
func onLoopback(cfg Config) Config {
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	return cfg
}

// refused is a port nothing listens on.
func refused(t *testing.T) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(l.Addr().String())
	l.Close()
	return a
}
