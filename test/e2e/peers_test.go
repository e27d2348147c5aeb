package e2e

// Peers (docs/DESIGN.md: wire format, answer rules, offline behaviour) end to
// end: three real clusters, edge-a local and edge-b, edge-c its peers, each
// peer reached through a harness proxy so that its link can be cut. Each
// subtest makes one fresh namespace name and creates it in all three clusters
// (a clusterset service is the same namespace and name in every cluster); Pod
// IPs say which cluster they are in: 10.1.x.y in edge-a, 10.2.x.y in edge-b,
// 10.3.x.y in edge-c, x the subtest.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// peersCorefile is edge-a with its two peers; {EXTRA} adds plugin lines
// (locality, expire).
const peersCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        peer edge-c {PEERC}
        ttl 5
{EXTRA}    }
}
`

const (
	peerC = "edge-c"
	// peerExpire is the `expire` of the prefer-local instance. The source
	// checks contact every 5 s, so after a cut its records stay at least
	// peerExpire - 5 s: long enough to see them kept, short enough to wait.
	peerExpire = 8 * time.Second
	// peerQueryTimeout bounds every query while a peer hangs or is cut: an
	// answer that waited for a peer would miss it.
	peerQueryTimeout = time.Second
)

// peersEnv is three clusters, a proxy in front of each peer, and two
// CoreDNS: pref (locality prefer-local, expire 8s, peers through the
// proxies) and any (locality any, no expire, peers directly).
type peersEnv struct {
	a, b, c   *harness.Cluster
	pb, pc    *harness.Proxy
	pref, any *harness.CoreDNS
	vars      map[string]string // pref's Corefile variables, for more instances
}

// TestPeers runs the issue-4 scenarios against three clusters started once,
// each subtest in a fresh namespace. The subtests that take a peer away come
// last, and each leaves it as it found it. Run one alone with
// -run 'TestPeers/Union'.
func TestPeers(t *testing.T) {
	harness.RequireTools(t)
	cs := harness.StartClusters(t, clusterID, peerID, peerC)
	e := &peersEnv{a: cs[0], b: cs[1], c: cs[2]}
	e.pb = harness.StartProxy(t, e.b.APIServerAddr())
	e.pc = harness.StartProxy(t, e.c.APIServerAddr())
	e.vars = map[string]string{
		"KUBECONFIG": e.a.Kubeconfig,
		"PEERB":      e.b.KubeconfigVia(t, e.pb),
		"PEERC":      e.c.KubeconfigVia(t, e.pc),
		"EXTRA":      fmt.Sprintf("        locality prefer-local\n        expire %s\n", peerExpire),
	}
	e.pref = startPeersCoreDNS(t, e.vars)
	e.any = startPeersCoreDNS(t, map[string]string{
		"KUBECONFIG": e.a.Kubeconfig,
		"PEERB":      e.b.Kubeconfig,
		"PEERC":      e.c.Kubeconfig,
		"EXTRA":      "        locality any\n",
	})
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *peersEnv)
	}{
		{"Union", testPeersUnion},
		{"Locality", testPeersLocality},
		{"Hostnames", testPeersHostnames},
		{"ClusterClaimRejected", testPeersClusterClaim},
		{"Failover", testPeersFailover},
		{"HungPeer", testPeersHung},
		{"Flapping", testPeersFlapping},
		{"CutExpireRestore", testPeersCutExpire},
		{"RestartWhileCut", testPeersRestartWhileCut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, d := range []*harness.CoreDNS{e.pref, e.any} {
				if !d.Running() {
					t.Fatalf("CoreDNS is not running (it exited in an earlier subtest)")
				}
			}
			tc.f(t, e)
		})
	}
}

// startPeersCoreDNS starts CoreDNS with peersCorefile; the test fails if it
// is not running at its end.
func startPeersCoreDNS(t *testing.T, vars map[string]string) *harness.CoreDNS {
	t.Helper()
	d := harness.StartCoreDNS(t, peersCorefile, vars)
	t.Cleanup(func() {
		if !d.Running() {
			_, err := d.Process().Exited()
			t.Errorf("CoreDNS exited during the test (%v)", err)
		}
	})
	return d
}

// namespace makes a fresh namespace name and creates it in all three clusters.
func (e *peersEnv) namespace(t *testing.T) string {
	t.Helper()
	ns := e.a.NewNamespace(t)
	e.b.CreateNamespace(t, ns)
	e.c.CreateNamespace(t, ns)
	return ns
}

// clusterHost is the clusterset name of one endpoint of a service in a cluster.
func clusterHost(hostname, cluster, name, ns string) string {
	return hostname + "." + cluster + "." + svc(name, ns)
}

// peerSRV is one SRV answer ("port target") of backend.
func peerSRV(hostname, cluster, ns string) string {
	return "8080 " + clusterHost(hostname, cluster, "backend", ns)
}

// waitPeers polls q on d until check accepts the answer, for at most timeout.
func waitPeers(t *testing.T, d *harness.CoreDNS, timeout time.Duration, q harness.Query, check func(*dns.Msg) error) time.Duration {
	t.Helper()
	_, took := eventuallyWithin(t, d, timeout, q, check)
	t.Logf("%s as expected after %s", qstr(q), took.Round(time.Millisecond))
	return took
}

// A service exported by the two peers only: every instance answers with the
// union of both, A and SRV (prefer-local has no local endpoint to prefer).
func testPeersUnion(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	name := svc("backend", ns)
	e.b.CreateReadyPods(t, ns, exporter("web-b", "web-b", ips("10.2.1.1"), backend))
	e.c.CreateReadyPods(t, ns,
		exporter("web-c1", "", ips("10.3.1.1"), backend),
		exporter("web-c2", "", ips("10.3.1.2"), backend))
	srvs := []string{peerSRV("web-b", peerID, ns), peerSRV("10-3-1-1", peerC, ns), peerSRV("10-3-1-2", peerC, ns)}
	for _, d := range []*harness.CoreDNS{e.pref, e.any} {
		waitPeers(t, d, propagation, harness.Query{Name: name, Type: dns.TypeA}, hasAddrs("10.2.1.1", "10.3.1.1", "10.3.1.2"))
		waitPeers(t, d, propagation, harness.Query{Name: name, Type: dns.TypeSRV, UDPSize: 4096}, hasSRVs(srvs...))
	}
	// A service in no cluster is still NXDOMAIN.
	waitPeers(t, e.pref, propagation, harness.Query{Name: svc("nothing", ns), Type: dns.TypeA}, isNXDOMAIN)
}

// prefer-local answers with the local endpoints when there are any; any
// answers with every cluster's. SRV follows the same choice.
func testPeersLocality(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	name := svc("backend", ns)
	e.a.CreateReadyPods(t, ns, exporter("web-a", "", ips("10.1.2.1"), backend))
	e.b.CreateReadyPods(t, ns, exporter("web-b", "", ips("10.2.2.1"), backend))
	e.c.CreateReadyPods(t, ns, exporter("web-c", "", ips("10.3.2.1"), backend))
	waitPeers(t, e.any, propagation, harness.Query{Name: name, Type: dns.TypeA}, hasAddrs("10.1.2.1", "10.2.2.1", "10.3.2.1"))
	waitPeers(t, e.any, propagation, harness.Query{Name: name, Type: dns.TypeSRV, UDPSize: 4096}, hasSRVs(
		peerSRV("10-1-2-1", clusterID, ns), peerSRV("10-2-2-1", peerID, ns), peerSRV("10-3-2-1", peerC, ns)))
	// Once any has all three, pref has seen the peers' Pods too (both
	// watch the same API servers); it must still answer the local one only.
	waitPeers(t, e.pref, propagation, harness.Query{Name: name, Type: dns.TypeA}, hasAddrs("10.1.2.1"))
	waitPeers(t, e.pref, propagation, harness.Query{Name: name, Type: dns.TypeSRV, UDPSize: 4096}, hasSRVs(peerSRV("10-1-2-1", clusterID, ns)))
	// The peers' endpoints are there: their per-endpoint names answer.
	waitPeers(t, e.pref, propagation, harness.Query{Name: clusterHost("10-2-2-1", peerID, "backend", ns), Type: dns.TypeA}, hasAddrs("10.2.2.1"))
}

// <hostname>.<clusterid>.<svc>.<ns> names every endpoint in every cluster,
// also where prefer-local hides the peers' endpoints from the service name;
// the same hostname in two clusters is two names; a cluster ID without a
// hostname is reserved (NXDOMAIN).
func testPeersHostnames(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	e.a.CreateReadyPods(t, ns, exporter("db-0", "db-0", ips("10.1.3.1"), backend))
	e.b.CreateReadyPods(t, ns, exporter("db-0", "db-0", ips("10.2.3.1"), backend))
	e.c.CreateReadyPods(t, ns,
		exporter("db-0", "db-0", ips("10.3.3.1"), backend),
		exporter("db-1", "", ips("10.3.3.2"), backend))
	for _, d := range []*harness.CoreDNS{e.pref, e.any} {
		for _, tc := range []struct{ host, cluster, ip string }{
			{"db-0", clusterID, "10.1.3.1"},
			{"db-0", peerID, "10.2.3.1"},
			{"db-0", peerC, "10.3.3.1"},
			{"10-3-3-2", peerC, "10.3.3.2"},
		} {
			waitPeers(t, d, propagation, harness.Query{Name: clusterHost(tc.host, tc.cluster, "backend", ns), Type: dns.TypeA}, hasAddrs(tc.ip))
		}
		// Wrong cluster for a hostname, and the reserved <clusterid>.<svc> name.
		waitPeers(t, d, propagation, harness.Query{Name: clusterHost("10-3-3-2", peerID, "backend", ns), Type: dns.TypeA}, isNXDOMAIN)
		waitPeers(t, d, propagation, harness.Query{Name: peerC + "." + svc("backend", ns), Type: dns.TypeA}, isNXDOMAIN)
	}
	// The peer's SRV target resolves, with the address in the additional section.
	m, _ := eventuallyWithin(t, e.any, propagation, harness.Query{Name: "_http._tcp." + svc("backend", ns), Type: dns.TypeSRV, UDPSize: 4096},
		hasSRVs(peerSRV("db-0", clusterID, ns), peerSRV("db-0", peerID, ns), peerSRV("db-0", peerC, ns), peerSRV("10-3-3-2", peerC, ns)))
	want := []string{
		clusterHost("10-3-3-2", peerC, "backend", ns) + " 10.3.3.2",
		clusterHost("db-0", clusterID, "backend", ns) + " 10.1.3.1",
		clusterHost("db-0", peerID, "backend", ns) + " 10.2.3.1",
		clusterHost("db-0", peerC, "backend", ns) + " 10.3.3.1",
	}
	if got := harness.ExtraAddrs(m); !slices.Equal(got, want) {
		t.Errorf("SRV additional section %q, want %q", got, want)
	}
}

// A Pod in edge-b that claims edge-c's (or edge-a's) name for its export is
// rejected for that entry; its other entry, and the other Pods, still count.
func testPeersClusterClaim(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	claimC := harness.ExportService{Name: "backend", Cluster: peerC, Ports: backend.Ports}
	claimA := harness.ExportService{Name: "claimed", Cluster: clusterID, Ports: backend.Ports}
	own := harness.ExportService{Name: "frontend", Cluster: peerID, Ports: backend.Ports}
	e.b.CreateReadyPods(t, ns,
		exporter("liar", "liar", ips("10.2.4.1"), claimC, claimA, own),
		exporter("honest", "honest", ips("10.2.4.2"), backend))
	e.c.CreateReadyPods(t, ns, exporter("web-c", "web-c", ips("10.3.4.1"), backend))
	for _, d := range []*harness.CoreDNS{e.pref, e.any} {
		// The good entries count: frontend from the liar, backend from the others.
		waitPeers(t, d, propagation, harness.Query{Name: svc("frontend", ns), Type: dns.TypeA}, hasAddrs("10.2.4.1"))
		waitPeers(t, d, propagation, harness.Query{Name: svc("backend", ns), Type: dns.TypeA}, hasAddrs("10.2.4.2", "10.3.4.1"))
		// The claims do not: no edge-c (nor edge-b) name for the liar in
		// backend, no claimed service at all.
		for _, name := range []string{
			clusterHost("liar", peerC, "backend", ns),
			clusterHost("liar", peerID, "backend", ns),
			svc("claimed", ns),
			clusterHost("liar", clusterID, "claimed", ns),
		} {
			waitPeers(t, d, propagation, harness.Query{Name: name, Type: dns.TypeA}, isNXDOMAIN)
		}
		waitPeers(t, d, propagation, harness.Query{Name: clusterHost("liar", peerID, "frontend", ns), Type: dns.TypeA}, hasAddrs("10.2.4.1"))
	}
}

// With prefer-local, the local endpoints going away (not Ready, then
// deleted) fails over to the peers' and coming back fails back.
func testPeersFailover(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	name := svc("backend", ns)
	q := harness.Query{Name: name, Type: dns.TypeA}
	e.b.CreateReadyPods(t, ns, exporter("web-b", "", ips("10.2.5.1"), backend))
	e.c.CreateReadyPods(t, ns, exporter("web-c", "", ips("10.3.5.1"), backend))
	waitPeers(t, e.any, propagation, q, hasAddrs("10.2.5.1", "10.3.5.1"))
	e.a.CreateReadyPods(t, ns,
		exporter("web-a1", "", ips("10.1.5.1"), backend),
		exporter("web-a2", "", ips("10.1.5.2"), backend))
	waitPeers(t, e.pref, propagation, q, hasAddrs("10.1.5.1", "10.1.5.2"))

	e.a.SetPodReady(t, ns, "web-a1", false)
	waitPeers(t, e.pref, propagation, q, hasAddrs("10.1.5.2"))
	e.a.SetPodReady(t, ns, "web-a2", false)
	waitPeers(t, e.pref, propagation, q, hasAddrs("10.2.5.1", "10.3.5.1"))
	waitPeers(t, e.pref, propagation, harness.Query{Name: name, Type: dns.TypeSRV, UDPSize: 4096},
		hasSRVs(peerSRV("10-2-5-1", peerID, ns), peerSRV("10-3-5-1", peerC, ns)))

	e.a.SetPodReady(t, ns, "web-a1", true)
	waitPeers(t, e.pref, propagation, q, hasAddrs("10.1.5.1"))
	e.a.DeletePod(t, ns, "web-a1")
	e.a.DeletePod(t, ns, "web-a2")
	waitPeers(t, e.pref, propagation, q, hasAddrs("10.2.5.1", "10.3.5.1"))
	waitPeers(t, e.any, propagation, q, hasAddrs("10.2.5.1", "10.3.5.1"))
}

// steadyWithin queries qs on d every 100 ms for dur; each must answer within
// its timeout and, when want is not nil, exactly as want (canonical, no TTL).
func steadyWithin(t *testing.T, d *harness.CoreDNS, dur time.Duration, qs []harness.Query, want []string) {
	t.Helper()
	start := time.Now()
	var (
		n     int
		fails []string
		worst time.Duration
	)
	for time.Since(start) < dur && len(fails) < maxFailures {
		for i, q := range qs {
			sent := time.Now()
			m, err := d.Exchange(q)
			took := time.Since(sent)
			worst = max(worst, took)
			n++
			switch {
			case err != nil:
				fails = append(fails, fmt.Sprintf("at %s: %s: %v (after %s)", sent.Sub(start).Round(time.Millisecond), qstr(q), err, took.Round(time.Millisecond)))
			case want != nil && canon(m, false) != want[i]:
				fails = append(fails, fmt.Sprintf("at %s: %s:\n  got  %s\n  want %s", sent.Sub(start).Round(time.Millisecond), qstr(q), canon(m, false), want[i]))
			}
		}
		time.Sleep(offlineEvery)
	}
	t.Logf("%d queries over %s, %d failed, slowest %s", n, time.Since(start).Round(time.Millisecond), len(fails), worst.Round(time.Microsecond))
	if len(fails) > 0 {
		if len(fails) > 10 {
			fails = fails[:10]
		}
		t.Errorf("queries failed or were slow while a peer was away (first %d):\n%s", len(fails), strings.Join(fails, "\n"))
	}
}

// oneEach makes a fresh namespace with one backend endpoint in each
// cluster (10.1.x.1, 10.2.x.1, 10.3.x.1, no hostname) and returns it with
// the queries those tests ask, each bounded by peerQueryTimeout: the
// service's A and SRV, and the per-endpoint name of named's endpoint.
func (e *peersEnv) oneEach(t *testing.T, x int, named *harness.Cluster) (string, []harness.Query) {
	t.Helper()
	ns := e.namespace(t)
	var endpoint string
	for i, c := range []*harness.Cluster{e.a, e.b, e.c} {
		ip := fmt.Sprintf("10.%d.%d.1", i+1, x)
		c.CreateReadyPods(t, ns, exporter("web-"+strings.TrimPrefix(c.Name, "edge-"), "", ips(ip), backend))
		if c == named {
			endpoint = clusterHost(dashed(ip), c.Name, "backend", ns)
		}
	}
	name := svc("backend", ns)
	return ns, []harness.Query{
		{Name: name, Type: dns.TypeA, Timeout: peerQueryTimeout},
		{Name: name, Type: dns.TypeSRV, UDPSize: 4096, Timeout: peerQueryTimeout},
		{Name: endpoint, Type: dns.TypeA, Timeout: peerQueryTimeout},
	}
}

// A peer whose API server hangs (SIGSTOP) slows no answer: local names,
// the other peer's, and the hung peer's last known endpoints (in the
// instance without expire) all answer within 1 s. A CoreDNS started while
// the peer hangs answers local names at once.
func testPeersHung(t *testing.T, e *peersEnv) {
	ns, qs := e.oneEach(t, 6, e.c)
	qs = append(qs, harness.Query{Name: svc("nothing", ns), Type: dns.TypeA, Timeout: peerQueryTimeout})
	waitPeers(t, e.any, propagation, qs[0], hasAddrs("10.1.6.1", "10.2.6.1", "10.3.6.1"))
	waitPeers(t, e.pref, propagation, qs[2], hasAddrs("10.3.6.1"))
	waitPeers(t, e.pref, propagation, qs[0], hasAddrs("10.1.6.1"))
	wantAny := answers(t, e.any, qs, false)
	wantPref := answers(t, e.pref, qs[:2], false) // edge-c's name may expire in pref

	e.c.PauseAPIServer(t)
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			e.c.ResumeAPIServer(t)
		}
	}
	t.Cleanup(resume)
	t.Log("edge-c's API server stopped (SIGSTOP)")

	// A CoreDNS started now (no snapshot): the local service answers as soon
	// as the local list is in, whatever edge-c does.
	vars := map[string]string{"KUBECONFIG": e.a.Kubeconfig, "PEERB": e.b.Kubeconfig, "PEERC": e.c.Kubeconfig, "EXTRA": ""}
	started := time.Now()
	fresh := startPeersCoreDNS(t, vars)
	took := waitPeers(t, fresh, 5*time.Second, qs[0], hasAddrs("10.1.6.1"))
	t.Logf("CoreDNS started while edge-c hangs: answering %s after start, local name %s later",
		(time.Since(started) - took).Round(time.Millisecond), took.Round(time.Millisecond))
	waitPeers(t, fresh, 5*time.Second, harness.Query{Name: clusterHost("10-2-6-1", peerID, "backend", ns), Type: dns.TypeA, Timeout: peerQueryTimeout}, hasAddrs("10.2.6.1"))

	// Every answer on time for 8 s of the hang (the client's request
	// timeouts and the 5 s contact probe fire meanwhile).
	steadyWithin(t, e.any, 4*time.Second, qs, wantAny)
	steadyWithin(t, e.pref, 2*time.Second, qs[:2], wantPref)
	steadyWithin(t, fresh, 2*time.Second, qs, nil)

	resume()
	waitPeers(t, fresh, resync, qs[0], hasAddrs("10.1.6.1")) // prefer-local: still local only
	waitPeers(t, fresh, resync, qs[2], hasAddrs("10.3.6.1"))
	waitPeers(t, e.pref, resync, qs[2], hasAddrs("10.3.6.1"))
}

// Cutting edge-b's link: its endpoints stay while the cut is shorter than
// expire, go when it is longer (edge-c's stay), and come back when the link
// does; no answer waits for edge-b meanwhile.
// flaps, flapDown and flapUp are issue 26's flapping link.
const (
	flaps    = 10
	flapDown = 3 * time.Second
	flapUp   = 3 * time.Second
)

// After edge-b's link flaps (10 times cut 3 s, back 3 s), a change made once
// it has been back for 2 s shows within 2 s more. The reflectors retry with
// a short, capped backoff (ingest.Backoff); client-go's default grew with
// each refused retry to 30 s (jittered up to 60 s) and reset only after two
// quiet minutes, so the change showed up to a minute late.
func testPeersFlapping(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	e.b.CreateReadyPods(t, ns, exporter("web-b", "", ips("10.2.9.1"), backend))
	q := harness.Query{Name: svc("backend", ns), Type: dns.TypeA, Timeout: peerQueryTimeout}
	waitPeers(t, e.pref, resync, q, hasAddrs("10.2.9.1"))

	restored := true
	t.Cleanup(func() {
		if !restored {
			e.pb.Restore(t)
		}
	})
	for i := range flaps {
		e.pb.Cut(t)
		restored = false
		time.Sleep(flapDown)
		e.pb.Restore(t)
		restored = true
		if i < flaps-1 {
			time.Sleep(flapUp)
		}
	}
	time.Sleep(2 * time.Second)
	e.b.CreateReadyPods(t, ns, exporter("web-b2", "", ips("10.2.9.2"), backend))
	took := waitPeers(t, e.pref, 2*time.Second, q, hasAddrs("10.2.9.1", "10.2.9.2"))
	t.Logf("after %d flaps, edge-b's change showed %s after it was made", flaps, took.Round(time.Millisecond))
}

func testPeersCutExpire(t *testing.T, e *peersEnv) {
	ns := e.namespace(t)
	e.b.CreateReadyPods(t, ns, exporter("web-b", "web-b", ips("10.2.7.1"), backend))
	e.c.CreateReadyPods(t, ns, exporter("web-c", "web-c", ips("10.3.7.1"), backend))
	name := svc("backend", ns)
	qA := harness.Query{Name: name, Type: dns.TypeA, Timeout: peerQueryTimeout}
	qHost := harness.Query{Name: clusterHost("web-b", peerID, "backend", ns), Type: dns.TypeA, Timeout: peerQueryTimeout}
	both := hasAddrs("10.2.7.1", "10.3.7.1")
	waitPeers(t, e.pref, resync, qA, both) // edge-c may be resyncing after the hang
	waitPeers(t, e.pref, propagation, qHost, hasAddrs("10.2.7.1"))
	qs := []harness.Query{qA, qHost}
	want := answers(t, e.pref, qs, false)

	cut := time.Now()
	e.pb.Cut(t)
	restored := false
	t.Cleanup(func() {
		if !restored {
			e.pb.Restore(t)
		}
	})
	t.Logf("edge-b's link cut")
	// Kept: contact was at most 5 s old at the cut, expire is 8 s.
	steadyWithin(t, e.pref, peerExpire-5*time.Second-500*time.Millisecond, qs, want)

	// Dropped after expire: edge-b's endpoints only.
	waitPeers(t, e.pref, 30*time.Second, qA, hasAddrs("10.3.7.1"))
	t.Logf("edge-b's endpoints dropped %s after the cut (expire %s)", time.Since(cut).Round(time.Millisecond), peerExpire)
	waitPeers(t, e.pref, time.Second, qHost, isNXDOMAIN)

	// A CoreDNS started while edge-b is cut (no snapshot) answers at once:
	// edge-c's service as soon as its list is in, the cut peer's names
	// NXDOMAIN, none of it waiting for edge-b.
	fresh := startPeersCoreDNS(t, map[string]string{"KUBECONFIG": e.a.Kubeconfig, "PEERB": e.vars["PEERB"], "PEERC": e.c.Kubeconfig, "EXTRA": ""})
	took := waitPeers(t, fresh, 5*time.Second, qA, hasAddrs("10.3.7.1"))
	t.Logf("CoreDNS started while edge-b is cut: edge-c's endpoint %s after it answered", took.Round(time.Millisecond))
	steadyWithin(t, fresh, time.Second, []harness.Query{qA, qHost}, answers(t, fresh, []harness.Query{qA, qHost}, false))
	steadyWithin(t, e.pref, time.Second, []harness.Query{qA, {Name: clusterHost("web-c", peerC, "backend", ns), Type: dns.TypeA, Timeout: peerQueryTimeout}}, nil)

	// A change on edge-b while cut shows after the link is back.
	e.b.CreateReadyPods(t, ns, exporter("web-b2", "", ips("10.2.7.2"), backend))
	e.pb.Restore(t)
	restored = true
	back := time.Now()
	waitPeers(t, e.pref, 45*time.Second, qA, hasAddrs("10.2.7.1", "10.2.7.2", "10.3.7.1"))
	waitPeers(t, e.pref, propagation, qHost, hasAddrs("10.2.7.1"))
	t.Logf("edge-b's endpoints back %s after the link", time.Since(back).Round(time.Millisecond))
}

// With a snapshot, a CoreDNS restarted while edge-b's link is cut answers
// edge-b's endpoints from its first answer (each source is persisted on its
// own), beside the live ones of edge-a and edge-c; they stay when the link
// is back.
func testPeersRestartWhileCut(t *testing.T, e *peersEnv) {
	_, qs := e.oneEach(t, 8, e.b)
	d := startPeersCoreDNS(t, map[string]string{"KUBECONFIG": e.a.Kubeconfig, "PEERB": e.vars["PEERB"], "PEERC": e.c.Kubeconfig,
		"EXTRA": "        locality any\n        snapshot " + snapshotPath(t) + "\n"})
	waitPeers(t, d, initialSync, qs[0], hasAddrs("10.1.8.1", "10.2.8.1", "10.3.8.1"))
	waitPeers(t, d, propagation, qs[2], hasAddrs("10.2.8.1"))
	want := answers(t, d, qs, false)
	time.Sleep(time.Second) // let the batched snapshot writer commit

	e.pb.Cut(t)
	t.Cleanup(func() { e.pb.Restore(t) })
	d.Restart(t)
	// The first answers, not eventually: they come from the snapshot.
	if got := answers(t, d, qs, false); !slices.Equal(got, want) {
		t.Fatalf("first answers after a restart with edge-b cut:\n  got  %q\n  want %q", got, want)
	}
	steadyWithin(t, d, 2*time.Second, qs, want)

	e.pb.Restore(t)
	steadyWithin(t, d, 2*time.Second, qs, want)
}
