package probe

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

func prefixes(ps ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, Prefix(netip.MustParsePrefix(p)))
	}
	return out
}

// Which addresses are refused, and why: the classes, their IPv4-mapped
// forms, the operator's deny prefixes (which win) and allow prefixes.
func TestRefuse(t *testing.T) {
	cfg := Defaults(All)
	cfg.Deny = prefixes("10.96.0.0/12", "::ffff:192.168.7.0/120", "127.77.9.0/24")
	cfg.Allow = prefixes("127.77.0.0/16")
	for _, tc := range []struct {
		addr string
		want Reason
	}{
		{"10.1.0.1", ""}, {"fd00::1", ""}, {"192.168.6.1", ""}, {"2001:db8::1", ""}, {"::ffff:10.1.0.1", ""},
		{"127.0.0.1", Loopback}, {"127.255.255.254", Loopback}, {"::1", Loopback}, {"::ffff:127.0.0.1", Loopback},
		{"0.0.0.0", Unspecified}, {"0.1.2.3", Unspecified}, {"::", Unspecified}, {"::ffff:0.0.0.0", Unspecified},
		{"169.254.169.254", LinkLocal}, {"169.254.0.1", LinkLocal}, {"fe80::1", LinkLocal}, {"febf::1", LinkLocal},
		{"fe80::1%eth0", LinkLocal}, {"::ffff:169.254.169.254", LinkLocal},
		{"224.0.0.1", Multicast}, {"239.1.2.3", Multicast}, {"ff02::1", Multicast}, {"ff05::2", Multicast}, {"::ffff:224.0.0.251", Multicast},
		{"255.255.255.255", Broadcast}, {"::ffff:255.255.255.255", Broadcast},
		{"10.96.0.1", Denied}, {"10.111.255.255", Denied}, {"::ffff:10.100.0.1", Denied}, {"192.168.7.10", Denied},
		{"127.77.1.1", ""},       // allowed
		{"127.77.9.1", Denied},   // allowed, but denied: deny wins
		{"127.78.0.1", Loopback}, // outside the allowed prefix
	} {
		if got := cfg.refuse(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("refuse(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// A refused endpoint is never dialed, is reported once (not each round,
// again when its address changes), and stays in the answers although a
// probe of it would fail.
func TestRefusedNotProbed(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want Reason
		deny []netip.Prefix
	}{
		{"127.0.0.1", Loopback, nil},
		{"::1", Loopback, nil},
		{"::ffff:127.0.0.1", Loopback, nil},
		{"0.0.0.0", Unspecified, nil},
		{"::", Unspecified, nil},
		{"169.254.169.254", LinkLocal, nil},
		{"fe80::1", LinkLocal, nil},
		{"224.0.0.1", Multicast, nil},
		{"ff02::1", Multicast, nil},
		{"255.255.255.255", Broadcast, nil},
		{"10.96.0.10", Denied, prefixes("10.96.0.0/12")},
	} {
		t.Run(tc.ip, func(t *testing.T) {
			cfg := Defaults(All)
			cfg.Deny = tc.deny
			var refusals []Refusal
			bad := mkpod("edge-b", "bad", tc.ip, true, "backend")
			e := newEnv(t, cfg, Options{Events: Events{}}, mkpod("edge-b", "good", "10.1.0.1", true, "backend"), bad)
			e.p.opts.Events.Refused = func(r Refusal) { refusals = append(refusals, r) }
			badAddr := netip.AddrPortFrom(bad.IPs[0], 8080).String()
			e.dialer.set(badAddr, false) // down, if it were probed
			e.ask("backend")
			for range 3 {
				e.round()
			}
			if n := e.dialer.count(badAddr); n != 0 {
				t.Errorf("%s dialed %d times", badAddr, n)
			}
			if n := e.dialer.count("10.1.0.1:8080"); n != 3 {
				t.Errorf("the good endpoint dialed %d times, want 3", n)
			}
			want := []string{"10.1.0.1"}
			if bad.IPs[0].Unmap().Is4() {
				want = append(want, bad.IPs[0].Unmap().String())
				slices.Sort(want)
			}
			e.wantAnswer("refused", "backend", want, false)
			if len(refusals) != 1 || refusals[0].Reason != tc.want || refusals[0].Endpoint.Pod.Name != "bad" || !refusals[0].Log {
				t.Fatalf("refusals %+v, want one of bad, %s, logged", refusals, tc.want)
			}
			if down, probed := e.p.Down(); len(down) != 0 || probed != 1 {
				t.Errorf("Down() = %v, %d probed; want none down, 1 probed", down, probed)
			}
			// A new address is a new target: reported again.
			bad2 := mkpod("edge-b", "bad", "127.0.0.2", true, "backend")
			e.tbl.Upsert(bad2)
			e.tbl.Rebuild()
			e.round()
			if len(refusals) != 2 || refusals[1].Endpoint.Addr.Addr() != bad2.IPs[0] {
				t.Errorf("refusals after the address changed: %+v, want a second one for %s", refusals, bad2.IPs[0])
			}
		})
	}
}

// The answers for a refused target are the same whether its port is open
// or closed, and nothing connects to it: by TCP (connectAll) or HTTP (the
// dialer). With loopback allowed, the same setup does tell the two apart,
// so the comparison would catch a probe.
func TestRefusedAnswersSameOpenOrClosed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		path    string
		allowed bool
	}{
		{"tcp", "", false}, {"http", "/healthz", false}, {"tcp loopback allowed", "", true}, {"http loopback allowed", "/healthz", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			acc := &accepts{Listener: srv.Listener}
			srv.Listener = acc
			srv.Start()
			defer srv.Close()
			open := netip.MustParseAddrPort(srv.Listener.Addr().String())
			closed := refused(t)
			cfg := Defaults(All)
			cfg.Path = tc.path
			if tc.allowed {
				cfg = onLoopback(cfg)
			}
			tbl := newTable()
			svcs := map[string]netip.AddrPort{"open": open, "closed": closed}
			var pods []*store.Pod
			for name, ap := range svcs {
				pod := mkpod("edge-b", name+"-0", ap.Addr().String(), true, name)
				pod.Exports[0].Ports = []annotation.Port{{Name: "http", Port: 80, TargetPort: int32(ap.Port()), Protocol: "TCP"}}
				pods = append(pods, pod)
			}
			tbl.ReplaceCluster("edge-b", pods)
			tbl.TrackDemand()
			ix := tbl.Rebuild()
			for name := range svcs {
				ix.Service("default", name)
			}
			p := New(tbl, cfg, Options{})
			for range cfg.Fails + 1 {
				p.Round(context.Background())
			}
			answer := func(name string) string {
				ix := tbl.Rebuild()
				a := ix.Lookup(name+".default.svc."+zone, dns.TypeA)
				host := ix.Lookup("127-0-0-1.edge-b."+name+".default.svc."+zone, dns.TypeA)
				return fmt.Sprintf("%s %d records, fail open %v; own name %s", a.Kind, len(a.A), a.FailOpen, host.Kind)
			}
			same := answer("open") == answer("closed")
			if same == tc.allowed {
				t.Errorf("open: %s; closed: %s; want them the same: %v", answer("open"), answer("closed"), !tc.allowed)
			}
			if n := acc.before(t); (n == 0) == tc.allowed {
				t.Errorf("%d connections accepted on the open port, want them only when loopback is allowed", n)
			}
		})
	}
}

// accepts is a listener that remembers the peers of the connections it
// accepts.
type accepts struct {
	net.Listener
	mu    sync.Mutex
	peers []string
}

func (a *accepts) Accept() (net.Conn, error) {
	c, err := a.Listener.Accept()
	if err == nil {
		a.mu.Lock()
		a.peers = append(a.peers, c.RemoteAddr().String())
		a.mu.Unlock()
	}
	return c, err
}

// before counts the connections made to a before this call: it connects
// once more and waits until that connection is accepted (a listener accepts
// in the order the connections completed), so that none made earlier is
// still waiting to be accepted.
func (a *accepts) before(t *testing.T) int {
	t.Helper()
	c, err := net.Dial("tcp", a.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mark := c.LocalAddr().String()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		a.mu.Lock()
		i := slices.Index(a.peers, mark)
		a.mu.Unlock()
		if i >= 0 {
			return i
		}
	}
	t.Fatalf("the marker connection %s was not accepted within 10 s", mark)
	return 0
}

// Endpoints sharing an address and port cost one probe a round, whose
// result they all take.
func TestOneProbePerAddressPort(t *testing.T) {
	var pods []*store.Pod
	for i := range 1000 {
		pods = append(pods, mkpod("edge-b", fmt.Sprintf("p%d", i), "10.9.0.1", true, fmt.Sprintf("svc-%d", i%50)))
	}
	pods = append(pods, mkpod("edge-b", "other", "10.9.0.2", true, "svc-0"))
	e := newEnv(t, Defaults(All), Options{}, pods...)
	for i := range 50 {
		e.ask(fmt.Sprintf("svc-%d", i))
	}
	e.round()
	if n := e.dialer.count("10.9.0.1:8080"); n != 1 {
		t.Errorf("10.9.0.1:8080 dialed %d times in a round, want 1", n)
	}
	if e.probes[true] != 2 {
		t.Errorf("probes %v, want 2 up (one per address and port)", e.probes)
	}
	e.dialer.set("10.9.0.1:8080", false)
	e.round()
	e.round()
	if n := e.dialer.count("10.9.0.1:8080"); n != 3 {
		t.Errorf("10.9.0.1:8080 dialed %d times in three rounds, want 3", n)
	}
	if down, probed := e.p.Down(); down["edge-b"] != 1000 || probed != 1001 {
		t.Errorf("Down() = %v, %d probed; want the 1000 sharing the address down, 1001 probed", down, probed)
	}
	e.wantAnswer("shared address down", "svc-0", []string{"10.9.0.2"}, false)
}

// Of one address, at most PortsPerAddress ports are probed a round: the
// ones probed before keep their place, then the lowest. A target over the
// cap is reported once and answered as without probing.
func TestPortsPerAddress(t *testing.T) {
	cfg := Defaults(All)
	cfg.PortsPerAddress = 4
	mk := func(port int) *store.Pod {
		pod := mkpod("edge-b", fmt.Sprintf("p%d", port), "10.9.0.1", true, fmt.Sprintf("svc-%d", port))
		pod.Exports[0].Ports = []annotation.Port{{Name: "http", Port: 80, TargetPort: int32(port), Protocol: "TCP"}}
		return pod
	}
	var pods []*store.Pod
	for port := 1010; port < 1030; port++ {
		pods = append(pods, mk(port))
	}
	pods = append(pods, mkpod("edge-b", "elsewhere", "10.9.0.2", true, "svc-1010"))
	e := newEnv(t, cfg, Options{}, pods...)
	for port := 1000; port < 1030; port++ {
		e.dialer.set(fmt.Sprintf("10.9.0.1:%d", port), true)
	}
	var refusals []Refusal
	e.p.opts.Events.Refused = func(r Refusal) { refusals = append(refusals, r) }
	for port := 1010; port < 1030; port++ {
		e.ask(fmt.Sprintf("svc-%d", port))
	}
	dialed := func() []int {
		var ports []int
		for port := 1000; port < 1030; port++ {
			if e.dialer.count(fmt.Sprintf("10.9.0.1:%d", port)) > 0 {
				ports = append(ports, port)
			}
		}
		return ports
	}
	for range 3 {
		e.round()
	}
	if got, want := dialed(), []int{1010, 1011, 1012, 1013}; !slices.Equal(got, want) {
		t.Errorf("ports dialed %v, want %v", got, want)
	}
	if len(refusals) != 16 {
		t.Errorf("%d refusals in three rounds, want 16 (each port over the cap once)", len(refusals))
	}
	for _, r := range refusals {
		if r.Reason != PortCap {
			t.Errorf("refusal %+v, want reason %s", r, PortCap)
		}
	}
	if e.dialer.count("10.9.0.2:8080") != 3 {
		t.Error("another address's endpoint was not probed each round")
	}
	// A lower port appears: the four probed keep their place.
	e.tbl.Upsert(mk(1000))
	e.tbl.Rebuild()
	e.ask("svc-1000")
	e.round()
	if got := dialed(); slices.Contains(got, 1000) {
		t.Errorf("ports dialed %v: the new lower port took a place of one probed before", got)
	}
	// Port 1013 goes down (and stays probed), then port 1012's Pod leaves:
	// its place goes to the lowest port not probed, 1000.
	e.dialer.set("10.9.0.1:1013", false)
	e.round()
	e.round()
	if down, _ := e.p.Down(); down["edge-b"] != 1 {
		t.Fatalf("Down() = %v, want 1013 down", down)
	}
	e.tbl.Delete(store.Key{Cluster: "edge-b", Namespace: "default", Name: "p1012"})
	e.tbl.Rebuild()
	e.round()
	if e.dialer.count("10.9.0.1:1000") != 1 {
		t.Errorf("the freed place went to port %v, want 1000 (the lowest not probed)", dialed())
	}
	if down, _ := e.p.Down(); down["edge-b"] != 1 {
		t.Errorf("Down() = %v, want 1013 still down", down)
	}
}

// Refusal reports are logged at about one a second (bursts of ten); the
// rest carry Log false and are counted in the next logged one.
func TestRefusalsRateLimited(t *testing.T) {
	var pods []*store.Pod
	for i := range 30 {
		pods = append(pods, mkpod("edge-b", fmt.Sprintf("b%02d", i), fmt.Sprintf("127.0.0.%d", i+1), true, "backend"))
	}
	e := newEnv(t, Defaults(All), Options{}, pods...)
	var refusals []Refusal
	e.p.opts.Events.Refused = func(r Refusal) { refusals = append(refusals, r) }
	e.ask("backend")
	e.round()
	logged := 0
	for _, r := range refusals {
		if r.Log {
			logged++
		}
	}
	if len(refusals) != 30 || logged != 10 {
		t.Fatalf("%d refusals, %d logged; want 30, 10", len(refusals), logged)
	}
	e.clk.Step(2 * e.p.cfg.Interval)
	e.tbl.Upsert(mkpod("edge-b", "late", "::1", true, "backend"))
	e.tbl.Rebuild()
	e.round()
	if last := refusals[len(refusals)-1]; !last.Log || last.Suppressed != 20 {
		t.Errorf("the next refusal %+v, want logged with 20 left out", last)
	}
}
