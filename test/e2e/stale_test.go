package e2e

// Stale answers end to end: two real clusters, the peer edge-b reached
// through a harness proxy whose link is cut. While it is cut, answers holding
// edge-b's records carry Extended DNS Error 3 (Stale Answer) naming edge-b,
// for queries with EDNS0 only, also after CoreDNS restarts while cut (the
// records, their policy and the last contact come from the snapshot); a
// service whose edge-b entries say "drop after 10 s" loses edge-b's
// endpoint, also after the restart; once the link is back, the mark goes
// and the endpoint is back.

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// staleCorefile is edge-a with the peer edge-b, every cluster's endpoints
// under the service name, a snapshot and metrics.
const staleCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        snapshot {SNAPSHOT}
        locality any
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

// staleMark bounds how long after a cut the mark shows: the contact check
// runs every 5 s and waits up to 3 s, then the 5 s grace, with room for a
// busy machine.
const staleMark = 40 * time.Second

// staleEDE returns the EXTRA-TEXT of the answer's EDE 3, and whether it has
// one; any other EDE is an error.
func staleEDE(m *dns.Msg) (string, bool, error) {
	opt := m.IsEdns0()
	if opt == nil {
		return "", false, nil
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			if e.InfoCode != dns.ExtendedErrorCodeStaleAnswer {
				return "", false, fmt.Errorf("EDE %d (%q), want only 3 (Stale Answer)", e.InfoCode, e.ExtraText)
			}
			return e.ExtraText, true, nil
		}
	}
	return "", false, nil
}

// marked accepts an answer with these addresses and EDE 3 naming cluster
// (want true), or with these addresses and no EDE (want false).
func marked(want bool, cluster string, addrs ...string) func(*dns.Msg) error {
	return func(m *dns.Msg) error {
		if err := hasAddrs(addrs...)(m); err != nil {
			return err
		}
		text, has, err := staleEDE(m)
		switch {
		case err != nil:
			return err
		case want && (!has || !strings.HasPrefix(text, "stale: "+cluster)):
			return fmt.Errorf("EDE %q (present %t), want Stale Answer naming %s", text, has, cluster)
		case !want && has:
			return fmt.Errorf("EDE %q, want none", text)
		}
		return nil
	}
}

func TestStaleAnswer(t *testing.T) {
	harness.RequireTools(t)
	cs := harness.StartClusters(t, clusterID, peerID)
	a, b := cs[0], cs[1]
	p := harness.StartProxy(t, b.APIServerAddr())
	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, staleCorefile, map[string]string{
		"KUBECONFIG": a.Kubeconfig,
		"PEERB":      b.KubeconfigVia(t, p),
		"SNAPSHOT":   snapshotPath(t),
		"METRICS":    strconv.Itoa(metrics),
	})
	t.Cleanup(func() {
		if !d.Running() {
			_, err := d.Process().Exited()
			t.Errorf("CoreDNS exited during the test (%v)", err)
		}
	})
	ns := a.NewNamespace(t)
	b.CreateNamespace(t, ns)
	backend := harness.ExportService{Name: "backend", Ports: []harness.ExportPort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}
	a.CreateReadyPods(t, ns, exporter("web-a", "", ips("10.1.40.1"), backend))
	// dropped: edge-b's exporter asks consumers to drop its endpoints 10 s
	// after they lose contact (written as the annotator writes the policy).
	drop := exporter("web-drop", "", ips("10.2.40.2"), harness.ExportService{Name: "dropped"})
	drop.Annotations[harness.ExportAnnotation] = `{"services":[{"name":"dropped","staleEndpoints":"Drop","staleGraceSeconds":10}]}`
	b.CreateReadyPods(t, ns, exporter("web-b", "", ips("10.2.40.1"), backend), drop)

	name := svc("backend", ns)
	withEDNS := harness.Query{Name: name, Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}
	plain := harness.Query{Name: name, Type: dns.TypeA, Timeout: peerQueryTimeout}
	peerName := harness.Query{Name: dashed("10.2.40.1") + "." + peerID + "." + name, Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}
	localName := harness.Query{Name: dashed("10.1.40.1") + "." + clusterID + "." + name, Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}
	both := []string{"10.1.40.1", "10.2.40.1"}

	dropped := harness.Query{Name: svc("dropped", ns), Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}

	// Both clusters connected: both endpoints, no mark.
	waitPeers(t, d, initialSync, withEDNS, marked(false, "", both...))
	waitPeers(t, d, initialSync, dropped, marked(false, "", "10.2.40.2"))
	staleBefore := metricSum(t, metrics, "coredns_mcsannotations_stale_answers_total", `cluster="`+peerID+`"`)

	p.Cut(t)
	cut := time.Now()
	took := waitPeers(t, d, staleMark, withEDNS, marked(true, peerID, both...))
	t.Logf("marked stale %s after the cut", took.Round(time.Millisecond))
	checkStale(t, d, plain, peerName, localName, withEDNS, both)
	if n := metricSum(t, metrics, "coredns_mcsannotations_stale_answers_total", `cluster="`+peerID+`"`) - staleBefore; n < 1 {
		t.Errorf("stale_answers_total{cluster=%q} rose by %v, want at least 1", peerID, n)
	}
	// The policy: dropped loses edge-b's endpoint (its only one) once the
	// grace has passed; backend keeps both, marked.
	waitPeers(t, d, staleMark, dropped, isNXDOMAIN)
	t.Logf("dropped answers NXDOMAIN %s after the cut", time.Since(cut).Round(time.Millisecond))
	if m, err := d.Exchange(withEDNS); err != nil {
		t.Fatal(err)
	} else if err := marked(true, peerID, both...)(m); err != nil {
		t.Errorf("backend (serve, the default) once dropped is dropped: %v", err)
	}

	// CoreDNS restarts while the link is cut: the snapshot's records are
	// served, marked once the grace after the start has passed, with the
	// age counted from the contact before the cut.
	d.Restart(t)
	waitPeers(t, d, staleMark, withEDNS, marked(true, peerID, both...))
	sinceCut := time.Since(cut) // the last contact was before the cut
	m, err := d.Exchange(withEDNS)
	if err != nil {
		t.Fatal(err)
	}
	text, _, _ := staleEDE(m)
	age, err := time.ParseDuration(strings.TrimPrefix(text, "stale: "+peerID+" "))
	if err != nil || age < sinceCut-time.Second {
		t.Errorf("EDE %q after the restart: want the age since the last contact before the cut (over %s)", text, sinceCut.Round(time.Second))
	}
	checkStale(t, d, plain, peerName, localName, withEDNS, both)
	// The snapshot keeps the entries' policy: dropped stays without
	// edge-b's endpoint.
	waitPeers(t, d, staleMark, dropped, isNXDOMAIN)

	p.Restore(t)
	took = waitPeers(t, d, resync, withEDNS, marked(false, "", both...))
	t.Logf("mark gone %s after the link is back", took.Round(time.Millisecond))
	waitPeers(t, d, propagation, peerName, marked(false, "", "10.2.40.1"))
	waitPeers(t, d, propagation, dropped, marked(false, "", "10.2.40.2"))
	logPluginLines(t, d, "->", "snapshot")
}

// checkStale checks, while edge-b is stale, the answers that name it (its
// endpoint name, both[1]), those that do not (edge-a's endpoint name,
// both[0]), a query without EDNS0 (the same answer, no OPT record), and
// what dig shows.
func checkStale(t *testing.T, d *harness.CoreDNS, plain, peerName, localName, withEDNS harness.Query, both []string) {
	t.Helper()
	for _, c := range []struct {
		q     harness.Query
		check func(*dns.Msg) error
	}{
		{peerName, marked(true, peerID, both[1])},
		{localName, marked(false, "", both[0])},
		{plain, func(m *dns.Msg) error {
			if m.IsEdns0() != nil {
				return fmt.Errorf("OPT record in the reply to a query without EDNS0: %v", m.IsEdns0())
			}
			return hasAddrs(both...)(m)
		}},
	} {
		m, err := d.Exchange(c.q)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.check(m); err != nil {
			t.Errorf("%s (EDNS0 %t): %v\n%v", qstr(c.q), c.q.UDPSize > 0, err, m)
		}
	}
	dig, err := exec.LookPath("dig")
	if err != nil {
		t.Logf("no dig installed: what it shows is not checked")
		return
	}
	for _, noedns := range []bool{false, true} {
		args := []string{"@127.0.0.1", "-p", strconv.Itoa(d.Port), "+tries=1", "+time=2", withEDNS.Name, "A"}
		if noedns {
			args = append(args, "+noedns")
		}
		out, err := exec.Command(dig, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("dig %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		shows := strings.Contains(string(out), "EDE: 3 (Stale Answer)") && strings.Contains(string(out), peerID)
		if shows == noedns {
			t.Errorf("dig %s shows the stale mark: %t, want %t:\n%s", strings.Join(args, " "), shows, !noedns, out)
		}
		if !noedns {
			t.Logf("dig %s:\n%s", strings.Join(args, " "), out)
		}
	}
}
