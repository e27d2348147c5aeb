package e2e

// Health probes (docs/DESIGN.md#answer-rules, issue 24) end to end: edge-a
// local, edge-b a peer behind a proxy, and Pods whose IPs are addresses of
// 127.0.0.0/8 with real listeners on them. CoreDNS probes in disconnected
// mode, so nothing is probed until edge-b is cut off.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

const probeCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    prometheus 127.0.0.1:{METRICS}
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        locality any
        snapshot {DIR}/table.db
        probe disconnected allow 127.77.0.0/16
    }
}
`

// probeWait bounds each wait for a probe's effect: two failed rounds of 2 s
// (plus jitter) and an index rebuild take about 5 s; the rest is slack for a
// loaded machine.
const probeWait = 30 * time.Second

func TestProbe(t *testing.T) {
	harness.RequireTools(t)
	cs := harness.StartClusters(t, clusterID, peerID)
	a, b := cs[0], cs[1]
	pb := harness.StartProxy(t, b.APIServerAddr())
	la := harness.StartListener(t, "127.77.1.1", 0)
	port := la.Port()
	lb1 := harness.StartListener(t, "127.77.2.1", port)
	lb2 := harness.StartListener(t, "127.77.2.2", port)
	ls1 := harness.StartListener(t, "127.77.3.1", port)
	ls2 := harness.StartListener(t, "127.77.3.2", port)
	all := []*harness.Listener{la, lb1, lb2, ls1, ls2}

	ns := a.NewNamespace(t)
	b.CreateNamespace(t, ns)
	ports := []harness.ExportPort{{Name: "http", Port: 80, TargetPort: int32(port), Protocol: "TCP"}}
	be := harness.ExportService{Name: "backend", Ports: ports}
	solo := harness.ExportService{Name: "solo", Ports: ports}
	a.CreateReadyPods(t, ns, exporter("web-a", "", ips(la.IP()), be))
	b.CreateReadyPods(t, ns,
		exporter("web-b1", "", ips(lb1.IP()), be), exporter("web-b2", "", ips(lb2.IP()), be),
		exporter("solo-1", "", ips(ls1.IP()), solo), exporter("solo-2", "", ips(ls2.IP()), solo))

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, probeCorefile, map[string]string{
		"KUBECONFIG": a.Kubeconfig, "PEERB": b.KubeconfigVia(t, pb), "METRICS": strconv.Itoa(metrics)})
	t.Cleanup(func() {
		if !d.Running() {
			t.Errorf("CoreDNS exited during the test")
		}
	})
	beName, soloName := svc("backend", ns), svc("solo", ns)
	beQ, soloQ := harness.Query{Name: beName, Type: dns.TypeA}, harness.Query{Name: soloName, Type: dns.TypeA}
	b1Host := harness.Query{Name: "127-77-2-1." + peerID + "." + beName, Type: dns.TypeA}
	wait := func(q harness.Query, check func(*dns.Msg) error) {
		t.Helper()
		_, took := eventuallyWithin(t, d, probeWait, q, check)
		t.Logf("%s as expected after %s", qstr(q), took.Round(time.Millisecond))
	}
	// ask keeps both services asked (probing follows demand) while f waits.
	askWhile := func(what string, f func() error) {
		t.Helper()
		took := harness.Eventually(t, probeWait, func() error {
			d.Exchange(beQ)
			d.Exchange(soloQ)
			return f()
		})
		t.Logf("%s after %s", what, took.Round(time.Millisecond))
	}
	accepted := func() []int64 {
		var n []int64
		for _, l := range all {
			n = append(n, l.Accepted())
		}
		return n
	}
	metric := func(name, labels string) float64 { return metricSum(t, metrics, name, labels) }

	wait(beQ, hasAddrs(la.IP(), lb1.IP(), lb2.IP()))
	wait(soloQ, hasAddrs(ls1.IP(), ls2.IP()))

	t.Run("ConnectedNotProbed", func(t *testing.T) {
		// Every source connected: asked for three rounds, nothing is probed.
		for end := time.Now().Add(3 * 2500 * time.Millisecond); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			d.Exchange(beQ)
			d.Exchange(soloQ)
		}
		if n := accepted(); slices.Max(n) != 0 {
			t.Errorf("connections to the endpoints while every source is connected: %v", n)
		}
		if n := metric("coredns_mcsannotations_probes_total", ""); n != 0 {
			t.Errorf("probes_total %v, want 0", n)
		}
	})

	pb.Cut(t)
	t.Cleanup(func() { pb.Restore(t) })
	askWhile("edge-b's endpoints probed", func() error {
		for _, l := range all[1:] {
			if l.Accepted() == 0 {
				return fmt.Errorf("%s not probed yet", l.IP())
			}
		}
		return nil
	})

	t.Run("StoppedLeavesStartedReturns", func(t *testing.T) {
		took, err := harness.ProbeFailover(t, d, beName, lb1, 2*time.Second, probeWait)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover: the last answer with %s came %s after its listener stopped (target: at most 5 s)", lb1.IP(), took.Round(time.Millisecond))
		wait(beQ, hasAddrs(la.IP(), lb2.IP()))
		wait(b1Host, isNXDOMAIN)
		if n := metric("coredns_mcsannotations_probe_endpoints_down", `cluster="edge-b"`); n != 1 {
			t.Errorf("probe_endpoints_down{cluster=edge-b} %v, want 1", n)
		}
		lb1.Start(t)
		wait(beQ, hasAddrs(la.IP(), lb1.IP(), lb2.IP()))
		wait(b1Host, hasAddrs(lb1.IP()))
	})

	t.Run("AllDownFailOpen", func(t *testing.T) {
		ls1.Stop(t)
		ls2.Stop(t)
		askWhile("solo's endpoints down", func() error {
			if n := metric("coredns_mcsannotations_probe_endpoints_down", `cluster="edge-b"`); n != 2 {
				return fmt.Errorf("probe_endpoints_down{cluster=edge-b} %v, want 2", n)
			}
			return nil
		})
		before := metric("coredns_mcsannotations_fail_open_answers_total", "")
		wait(soloQ, hasAddrs(ls1.IP(), ls2.IP()))
		if n := metric("coredns_mcsannotations_fail_open_answers_total", ""); n <= before {
			t.Errorf("fail_open_answers_total %v, not more than %v before the answer", n, before)
		}
		if !strings.Contains(d.Log(), "solo-1 at "+ls1.Addr()+" is down: 2 probes in a row failed") {
			t.Errorf("no log line for solo-1 going down")
		}
	})

	t.Run("ConnectedSourceNeverProbed", func(t *testing.T) {
		if n := la.Accepted(); n != 0 {
			t.Errorf("edge-a's endpoint was connected to %d times; edge-a is connected", n)
		}
	})

	t.Run("RestartWhileCut", func(t *testing.T) {
		d.Restart(t)
		// From the snapshot, before any probe: everything, as last listed.
		if m, err := d.Exchange(beQ); err != nil || hasAddrs(la.IP(), lb1.IP(), lb2.IP())(m) != nil {
			t.Errorf("first answer after the restart: %v %v", m, err)
		}
		before := lb2.Accepted()
		askWhile("probing resumed", func() error {
			if lb2.Accepted() == before {
				return fmt.Errorf("%s not probed since the restart", lb2.IP())
			}
			if n := metric("coredns_mcsannotations_probe_endpoints_down", `cluster="edge-b"`); n != 2 {
				return fmt.Errorf("probe_endpoints_down{cluster=edge-b} %v, want 2 (solo's)", n)
			}
			return nil
		})
		lb2.Stop(t)
		wait(beQ, hasAddrs(la.IP(), lb1.IP()))
		lb2.Start(t)
		wait(beQ, hasAddrs(la.IP(), lb1.IP(), lb2.IP()))
		if n := la.Accepted(); n != 0 {
			t.Errorf("edge-a's endpoint was connected to %d times", n)
		}
	})

	t.Run("ReconnectReadyTakesOver", func(t *testing.T) {
		// solo's listeners are still stopped; once edge-b answers again its
		// Ready conditions count, and nothing of it is probed.
		pb.Restore(t)
		askWhile("edge-b's marks dropped", func() error {
			if n := metric("coredns_mcsannotations_probe_endpoints_down", ""); n != 0 {
				return fmt.Errorf("probe_endpoints_down %v, want 0", n)
			}
			if n := metric("coredns_mcsannotations_probe_endpoints", ""); n != 0 {
				return fmt.Errorf("probe_endpoints %v, want 0", n)
			}
			return nil
		})
		wait(soloQ, hasAddrs(ls1.IP(), ls2.IP()))
		if !strings.Contains(d.Log(), "cluster edge-b is connected: its Ready conditions count again") {
			t.Errorf("no log line for the marks dropped at the reconnect")
		}
		time.Sleep(3 * time.Second) // a round in flight ends
		n := accepted()
		for end := time.Now().Add(3 * 2500 * time.Millisecond); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			d.Exchange(beQ)
			d.Exchange(soloQ)
		}
		if m := accepted(); !slices.Equal(m, n) {
			t.Errorf("connections after edge-b reconnected: %v, then %v", n, m)
		}
	})
}

// TestProbeFailoverFigure runs the failover measurement the benchmark
// reports (harness.MeasureProbeFailover) and logs its figure; it asserts
// only that the endpoint left the answers.
func TestProbeFailoverFigure(t *testing.T) {
	harness.RequireTools(t)
	took, err := harness.MeasureProbeFailover(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover with the probe defaults: %s (target: at most 5 s)", took.Round(time.Millisecond))
}

// metricSum reads the series of name whose labels contain labels (all of
// name's series when labels is "") from CoreDNS's prometheus endpoint on
// port, and sums them; 0 when there are none.
func metricSum(t *testing.T, port int, name, labels string) float64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		t.Fatalf("metrics: %s: %s", resp.Status, b)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) || !strings.Contains(rest, labels) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metrics: %q: %v", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return sum
}
