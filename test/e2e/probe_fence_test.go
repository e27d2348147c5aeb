package e2e

// Probe targets a tenant can aim (finding 7 of issue 36), end to end: Pods
// of a real API server whose IPs are loopback addresses with listeners on
// them. CoreDNS probes every asked endpoint (probe all), allows one /24 of
// loopback for a control, and denies part of it.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

const fenceCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    prometheus 127.0.0.1:{METRICS}
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        probe all interval 500ms timeout 500ms fails 1 passes 1 allow 127.66.2.0/24 deny 127.66.2.128/25
    }
}
`

// TestProbeFence: a loopback endpoint (not allowed) and a denied one are
// never connected to, and answered whether their port is open or closed,
// each counted and logged once; endpoints sharing an address and port cost
// one connection a round; allowed endpoints are probed as before (the
// control: a closed one leaves the answers).
func TestProbeFence(t *testing.T) {
	harness.RequireTools(t)
	c := harness.StartCluster(t, clusterID)
	aimed := harness.StartListener(t, "127.66.1.1", 0) // refused: loopback
	port := aimed.Port()
	ctl := harness.StartListener(t, "127.66.2.1", port)      // allowed
	crowd := harness.StartListener(t, "127.66.2.3", port)    // allowed, shared by 20 Pods
	denied := harness.StartListener(t, "127.66.2.200", port) // allowed, but denied
	// Nothing listens on 127.66.1.2, 127.66.2.2 and 127.66.2.201 at port.

	ns := c.NewNamespace(t)
	ports := []harness.ExportPort{{Name: "http", Port: 80, TargetPort: int32(port), Protocol: "TCP"}}
	es := func(name string) harness.ExportService { return harness.ExportService{Name: name, Ports: ports} }
	pods := []harness.ReadyPod{
		exporter("aimed-open", "", ips("127.66.1.1"), es("aimed")), exporter("aimed-closed", "", ips("127.66.1.2"), es("aimed")),
		exporter("ctl-open", "", ips("127.66.2.1"), es("ctl")), exporter("ctl-closed", "", ips("127.66.2.2"), es("ctl")),
		exporter("den-open", "", ips("127.66.2.200"), es("den")), exporter("den-closed", "", ips("127.66.2.201"), es("den")),
	}
	for i := range 20 {
		pods = append(pods, exporter(fmt.Sprintf("crowd-%d", i), "", ips("127.66.2.3"), es("crowd")))
	}
	c.CreateReadyPods(t, ns, pods...)

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, fenceCorefile, map[string]string{"KUBECONFIG": c.Kubeconfig, "METRICS": strconv.Itoa(metrics)})
	t.Cleanup(func() {
		if !d.Running() {
			t.Errorf("CoreDNS exited during the test")
		}
	})
	q := func(name string) harness.Query { return harness.Query{Name: svc(name, ns), Type: dns.TypeA} }
	ask := func() {
		for _, s := range []string{"aimed", "ctl", "den", "crowd"} {
			d.Exchange(q(s))
		}
	}
	metric := func(name, labels string) float64 { return metricSum(t, metrics, name, labels) }

	// The control: probing runs, and a closed allowed endpoint leaves.
	took := harness.Eventually(t, probeWait, func() error {
		ask()
		m, err := d.Exchange(q("ctl"))
		if err != nil {
			return err
		}
		if err := hasAddrs("127.66.2.1")(m); err != nil {
			return err
		}
		if ctl.Accepted() < 5 {
			return fmt.Errorf("ctl-open probed %d times, want 5 rounds", ctl.Accepted())
		}
		return nil
	})
	t.Logf("ctl-closed left the answers, five rounds probed, after %s", took.Round(time.Millisecond))

	// Refused and denied endpoints: answered, open or closed.
	for name, want := range map[string][]string{"aimed": {"127.66.1.1", "127.66.1.2"}, "den": {"127.66.2.200", "127.66.2.201"}} {
		m, err := d.Exchange(q(name))
		if err != nil {
			t.Fatal(err)
		}
		if err := hasAddrs(want...)(m); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, ip := range want {
			hq := harness.Query{Name: dashed(ip) + "." + clusterID + "." + svc(name, ns), Type: dns.TypeA}
			if m, err := d.Exchange(hq); err != nil || hasAddrs(ip)(m) != nil {
				t.Errorf("%s: %v %v", qstr(hq), m, err)
			}
		}
	}
	// Never connected to: a connection of our own, once accepted (the
	// listener closes what it accepts: our read ends), leaves none made
	// earlier unaccepted.
	for _, l := range []*harness.Listener{aimed, denied} {
		conn, err := net.Dial("tcp", l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: our connection read %v, want EOF (accepted and closed)", l.Addr(), err)
		}
		conn.Close()
		if n := l.Accepted(); n != 1 {
			t.Errorf("%s accepted %d connections besides ours; want none (never probed)", l.Addr(), n-1)
		}
	}
	// Twenty Pods at one address and port: one connection a round, as the
	// one Pod of ctl-open gets (a round may fall between the two reads).
	if n, one := crowd.Accepted(), ctl.Accepted(); n > one+2 {
		t.Errorf("the address shared by 20 Pods accepted %d connections, ctl-open's %d: want one a round", n, one)
	}
	for reason, want := range map[string]float64{"loopback": 2, "denied": 2, "link_local": 0} {
		if n := metric("coredns_mcsannotations_probe_targets_refused_total", `reason="`+reason+`"`); n != want {
			t.Errorf("probe_targets_refused_total{reason=%q} %v, want %v (once per endpoint, not per round)", reason, n, want)
		}
	}
	log := d.Log()
	for _, want := range []string{
		"Pod " + ns + "/aimed-open at 127.66.1.1:" + strconv.Itoa(port) + " is not probed: 127.66.1.1 is a loopback address",
		"Pod " + ns + "/den-closed at 127.66.2.201:" + strconv.Itoa(port) + " is not probed: 127.66.2.201 is in a denied prefix",
	} {
		if n := strings.Count(log, want); n != 1 {
			t.Errorf("log lines with %q: %d, want 1", want, n)
		}
	}
}
