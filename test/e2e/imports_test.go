package e2e

// Imports (docs/DESIGN.md#answer-rules, aliases and imports enforce) end to
// end: alias names answered per consumer Pod, identified by the query's source
// address, in the clusterset zone and in cluster.local beside the real in-tree
// kubernetes plugin; imports limited to a cluster (a peer); edits, removal and
// IP reuse; and `imports enforce`.
//
// The importing Pods get IPs of 127.0.0.0/8 (the API server accepts them as
// Pod IPs), so that a query sent from that local address is, to CoreDNS, a
// query from that Pod. Each subtest has its own addresses: Pods of earlier
// subtests stay (namespaces are never deleted).

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// importsCorefile serves both zones in one server block: mcsannotations with
// cluster.local as an alias zone and a peer, and the in-tree kubernetes
// plugin for cluster.local on the same API server.
const importsCorefile = `clusterset.local:{PORT} cluster.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local cluster.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEER}
        ttl 5
    }
    kubernetes cluster.local {
        kubeconfig {KUBECONFIG}
    }
}
`

// enforceCorefile adds imports enforce, with 127.0.200.0/24 allowed (no Pod
// has an address there), and metrics.
const enforceCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        ttl 5
        imports enforce allow 127.0.200.0/24
    }
    prometheus 127.0.0.1:{METRICS}
}
`

// cachedCorefile is both zones, aliases and enforce behind the cache plugin,
// as in the cluster's usual Corefile (cache runs before the plugin, whatever
// the order of the lines). The cache keys on the name alone: the plugin has
// it pass its zones through (CacheBypassZones), as answers there depend on
// the client.
const cachedCorefile = `clusterset.local:{PORT} cluster.local:{PORT} {
    bind 127.0.0.1
    cache 30
    mcsannotations clusterset.local cluster.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        ttl 5
        imports enforce allow 127.0.200.0/24
    }
    kubernetes cluster.local {
        kubeconfig {KUBECONFIG}
    }
}
`

const (
	clusterLocal = "cluster.local."
	peerID       = "edge-b"
	allowedIP    = "127.0.200.5" // in the enforce instance's allow CIDR
	unknownIP    = "127.0.0.199" // no Pod has it
)

// importsEnv is two clusters (edge-a local, edge-b its peer) and CoreDNS
// with both zones.
type importsEnv struct {
	a, b *harness.Cluster
	dns  *harness.CoreDNS
}

// TestImports runs the issue-5 scenarios against two clusters and one
// CoreDNS (a second one, with imports enforce, for Enforce), each subtest in
// fresh namespaces. Run one alone with -run 'TestImports/IPReuse'.
func TestImports(t *testing.T) {
	harness.RequireTools(t)
	cs := harness.StartClusters(t, clusterID, peerID)
	e := &importsEnv{a: cs[0], b: cs[1]}
	e.dns = harness.StartCoreDNS(t, importsCorefile, map[string]string{
		"KUBECONFIG": e.a.Kubeconfig, "PEER": e.b.Kubeconfig})
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *importsEnv)
	}{
		{"AliasBothZones", testAliasBothZones},
		{"ClusterLimited", testClusterLimited},
		{"Fallthrough", testFallthrough},
		{"EditAndRemove", testEditAndRemove},
		{"IPReuse", testIPReuse},
		{"Enforce", testEnforce},
		{"Cache", testCache},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !e.dns.Running() {
				t.Fatalf("CoreDNS is not running (it exited in an earlier subtest)")
			}
			tc.f(t, e)
		})
	}
	if !e.dns.Running() {
		_, err := e.dns.Process().Exited()
		t.Errorf("CoreDNS exited during the test (%v)", err)
	}
}

// svcIn is the name of a service in zone.
func svcIn(name, ns, zone string) string { return name + "." + ns + ".svc." + zone }

// peerHost is the clusterset name of a backend endpoint in edge-b (no spec.hostname).
func peerHost(ip, ns string) string { return dashed(ip) + "." + peerID + "." + svc("backend", ns) }

// from is a UDP query of name/qtype sent from the local address src.
func from(src, name string, qtype uint16) harness.Query {
	return harness.Query{Name: name, Type: qtype, Source: src}
}

// waitFor polls q against d until check accepts the answer (at most
// propagation) and returns how long that took.
func waitFor(t *testing.T, d *harness.CoreDNS, q harness.Query, check func(*dns.Msg) error) time.Duration {
	t.Helper()
	took := harness.Eventually(t, propagation, func() error {
		m, err := d.Exchange(q)
		if err != nil {
			return err
		}
		if err := check(m); err != nil {
			return fmt.Errorf("%s %s from %s: %w\n%s", q.Name, dns.TypeToString[q.Type], q.Source, err, m)
		}
		return nil
	})
	t.Logf("%s %s from %s as expected after %s", q.Name, dns.TypeToString[q.Type], q.Source, took.Round(time.Millisecond))
	return took
}

// expect asks once: for answers that no longer change (an earlier wait showed
// CoreDNS has seen the state they depend on).
func expect(t *testing.T, d *harness.CoreDNS, q harness.Query, check func(*dns.Msg) error) {
	t.Helper()
	m, err := d.Exchange(q)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(m); err != nil {
		t.Errorf("%s %s from %s: %v\n%s", q.Name, dns.TypeToString[q.Type], q.Source, err, m)
	}
}

// importer is a Running, Ready importing Pod with one IP.
func importer(name, ip string, imps ...harness.ImportService) harness.ReadyPod {
	return harness.ReadyPod{Pod: harness.ImporterPod(name, imps...), IPs: ips(ip)}
}

// exporters makes Ready exporter Pods of backend in ns, one per IP.
func exporters(t *testing.T, c *harness.Cluster, ns string, s harness.ExportService, addrs ...string) {
	t.Helper()
	var pods []harness.ReadyPod
	for i, ip := range addrs {
		pods = append(pods, exporter(fmt.Sprintf("%s-%d", s.Name, i), "", ips(ip), s))
	}
	c.CreateReadyPods(t, ns, pods...)
}

// The importing Pod's alias answers in both zones, over UDP and TCP, with the
// imported service's endpoints (and SRV under it); the same names asked by
// another importing Pod of the same namespace, by a client that is no Pod,
// or by the importing Pod for another namespace are not ours: NXDOMAIN in
// clusterset.local, the kubernetes plugin's NXDOMAIN in cluster.local.
func testAliasBothZones(t *testing.T, e *importsEnv) {
	svcNS, ns := e.a.NewNamespace(t), e.a.NewNamespace(t)
	exporters(t, e.a, svcNS, backend, "10.250.1.1", "10.250.1.2")
	const me, other = "127.0.0.11", "127.0.0.12"
	e.a.CreateReadyPods(t, ns,
		importer("consumer", me, harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "be"}),
		importer("neighbour", other, harness.ImportService{Name: "backend", Namespace: svcNS})) // no alias
	want := hasAddrs("10.250.1.1", "10.250.1.2")

	for _, z := range []string{zone, clusterLocal} {
		waitFor(t, e.dns, from(me, svcIn("be", ns, z), dns.TypeA), want)
		expect(t, e.dns, harness.Query{Name: svcIn("be", ns, z), Type: dns.TypeA, Source: me, TCP: true}, want)
		expect(t, e.dns, from(me, "_http._tcp."+svcIn("be", ns, z), dns.TypeSRV), hasSRVs(
			"8080 "+host(dashed("10.250.1.1"), "backend", svcNS), "8080 "+host(dashed("10.250.1.2"), "backend", svcNS)))
		for _, src := range []string{other, unknownIP, ""} {
			expect(t, e.dns, from(src, svcIn("be", ns, z), dns.TypeA), isNXDOMAIN)
			expect(t, e.dns, harness.Query{Name: svcIn("be", ns, z), Type: dns.TypeA, Source: src, TCP: true}, isNXDOMAIN)
		}
		// An alias lives in the importing Pod's own namespace only.
		expect(t, e.dns, from(me, svcIn("be", svcNS, z), dns.TypeA), isNXDOMAIN)
	}
	// The real name answers everyone (no enforce here).
	for _, src := range []string{me, other, ""} {
		expect(t, e.dns, from(src, svc("backend", svcNS), dns.TypeA), want)
	}
}

// An import limited to a cluster answers that cluster's endpoints only; one
// without a cluster follows the locality policy (the local ones first), as the
// clusterset name does.
func testClusterLimited(t *testing.T, e *importsEnv) {
	svcNS, ns := e.a.NewNamespace(t), e.a.NewNamespace(t)
	e.b.CreateNamespace(t, svcNS)
	exporters(t, e.a, svcNS, backend, "10.250.2.1")
	exporters(t, e.b, svcNS, backend, "10.251.2.1", "10.251.2.2")
	const me = "127.0.0.21"
	e.a.CreateReadyPods(t, ns, importer("consumer", me,
		harness.ImportService{Name: "backend", Namespace: svcNS, Cluster: peerID, Alias: "be-b"},
		harness.ImportService{Name: "backend", Namespace: svcNS, Cluster: clusterID, Alias: "be-a"},
		harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "be-any"}))

	// Both clusters' endpoints are known before the aliases are judged.
	waitFor(t, e.dns, from(me, peerHost("10.251.2.2", svcNS), dns.TypeA), hasAddrs("10.251.2.2"))
	waitFor(t, e.dns, from(me, svc("backend", svcNS), dns.TypeA), hasAddrs("10.250.2.1"))

	for _, z := range []string{zone, clusterLocal} {
		waitFor(t, e.dns, from(me, svcIn("be-b", ns, z), dns.TypeA), hasAddrs("10.251.2.1", "10.251.2.2"))
		expect(t, e.dns, from(me, svcIn("be-a", ns, z), dns.TypeA), hasAddrs("10.250.2.1"))
		expect(t, e.dns, from(me, svcIn("be-any", ns, z), dns.TypeA), hasAddrs("10.250.2.1"))
		expect(t, e.dns, from(me, "_http._tcp."+svcIn("be-b", ns, z), dns.TypeSRV), hasSRVs(
			"8080 "+peerHost("10.251.2.1", svcNS), "8080 "+peerHost("10.251.2.2", svcNS)))
	}

	// The local endpoint gone: be-any falls back to the peer, be-a has no
	// ready endpoint and is no alias any more (NXDOMAIN, in cluster.local the
	// kubernetes plugin's).
	e.a.DeletePod(t, svcNS, "backend-0")
	waitFor(t, e.dns, from(me, svcIn("be-any", ns, zone), dns.TypeA), hasAddrs("10.251.2.1", "10.251.2.2"))
	for _, z := range []string{zone, clusterLocal} {
		expect(t, e.dns, from(me, svcIn("be-a", ns, z), dns.TypeA), isNXDOMAIN)
		expect(t, e.dns, from(me, svcIn("be-b", ns, z), dns.TypeA), hasAddrs("10.251.2.1", "10.251.2.2"))
	}
}

// In cluster.local every name that is not the client's alias goes to the
// kubernetes plugin: a ClusterIP Service answers its ClusterIP (allocated by
// the API server) to everyone, the importing Pod included, except where the
// importing Pod's alias has the same name: for that Pod alone, the alias.
func testFallthrough(t *testing.T, e *importsEnv) {
	svcNS, ns := e.a.NewNamespace(t), e.a.NewNamespace(t)
	exporters(t, e.a, svcNS, backend, "10.250.3.1")
	webIP := e.a.CreateClusterIPService(t, ns, "web")
	dbIP := e.a.CreateClusterIPService(t, ns, "db")
	t.Logf("ClusterIPs: web %s, db %s", webIP, dbIP)
	const me, other = "127.0.0.31", "127.0.0.32"
	e.a.CreateReadyPods(t, ns,
		importer("consumer", me, harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "web"}),
		importer("neighbour", other))

	// The kubernetes plugin has the Services (it lists them through its own watch).
	waitFor(t, e.dns, from("", svcIn("db", ns, clusterLocal), dns.TypeA), hasAddrs(dbIP))
	waitFor(t, e.dns, from(me, svcIn("web", ns, clusterLocal), dns.TypeA), hasAddrs("10.250.3.1"))
	for _, src := range []string{other, unknownIP, ""} {
		expect(t, e.dns, from(src, svcIn("web", ns, clusterLocal), dns.TypeA), hasAddrs(webIP))
	}
	expect(t, e.dns, from(me, svcIn("db", ns, clusterLocal), dns.TypeA), hasAddrs(dbIP))
	expect(t, e.dns, from(me, svcIn("nothing", ns, clusterLocal), dns.TypeA), isNXDOMAIN)
	// The API server's own Service, in default.
	waitFor(t, e.dns, from(me, "kubernetes.default.svc."+clusterLocal, dns.TypeA), func(m *dns.Msg) error {
		if m.Rcode != dns.RcodeSuccess || len(harness.Addrs(m)) != 1 {
			return fmt.Errorf("rcode %s, addresses %v: want one ClusterIP", harness.Rcode(m), harness.Addrs(m))
		}
		return nil
	})
	// The alias answers in the clusterset zone too; the Service's name there
	// is not the kubernetes plugin's (it does not serve clusterset.local).
	expect(t, e.dns, from(me, svcIn("web", ns, zone), dns.TypeA), hasAddrs("10.250.3.1"))
	expect(t, e.dns, from(other, svcIn("web", ns, zone), dns.TypeA), isNXDOMAIN)
}

// An edit of the import annotation takes effect (bounded at a few seconds,
// the time taken logged); removing the annotation removes the alias, and the
// cluster.local name goes back to the kubernetes plugin.
func testEditAndRemove(t *testing.T, e *importsEnv) {
	svcNS, ns := e.a.NewNamespace(t), e.a.NewNamespace(t)
	frontend := harness.ExportService{Name: "frontend", Ports: []harness.ExportPort{{Name: "http", Port: 80}}}
	exporters(t, e.a, svcNS, backend, "10.250.4.1")
	exporters(t, e.a, svcNS, frontend, "10.250.4.2")
	const me = "127.0.0.41"
	e.a.CreateReadyPods(t, ns, importer("consumer", me, harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "be"}))
	waitFor(t, e.dns, from(me, svcIn("be", ns, clusterLocal), dns.TypeA), hasAddrs("10.250.4.1"))
	expect(t, e.dns, from(me, svcIn("fe", ns, clusterLocal), dns.TypeA), isNXDOMAIN)

	// The alias retargeted, and a second one added.
	e.a.SetPodAnnotation(t, ns, "consumer", harness.ImportAnnotation, harness.ImportJSON(
		harness.ImportService{Name: "frontend", Namespace: svcNS, Alias: "be"},
		harness.ImportService{Name: "frontend", Namespace: svcNS, Alias: "fe"}))
	took := waitFor(t, e.dns, from(me, svcIn("be", ns, clusterLocal), dns.TypeA), hasAddrs("10.250.4.2"))
	t.Logf("edit of the import annotation visible after %s", took.Round(time.Millisecond))
	expect(t, e.dns, from(me, svcIn("fe", ns, zone), dns.TypeA), hasAddrs("10.250.4.2"))

	// An alias dropped from the annotation: gone, the other stays.
	e.a.SetPodAnnotation(t, ns, "consumer", harness.ImportAnnotation, harness.ImportJSON(
		harness.ImportService{Name: "frontend", Namespace: svcNS, Alias: "fe"}))
	waitFor(t, e.dns, from(me, svcIn("be", ns, clusterLocal), dns.TypeA), isNXDOMAIN)
	expect(t, e.dns, from(me, svcIn("be", ns, zone), dns.TypeA), isNXDOMAIN)
	expect(t, e.dns, from(me, svcIn("fe", ns, clusterLocal), dns.TypeA), hasAddrs("10.250.4.2"))

	// The annotation removed: no alias at all.
	e.a.RemovePodAnnotation(t, ns, "consumer", harness.ImportAnnotation)
	took = waitFor(t, e.dns, from(me, svcIn("fe", ns, clusterLocal), dns.TypeA), isNXDOMAIN)
	t.Logf("removal of the import annotation visible after %s", took.Round(time.Millisecond))
	expect(t, e.dns, from(me, svcIn("fe", ns, zone), dns.TypeA), isNXDOMAIN)
	// The real names are unaffected.
	expect(t, e.dns, from(me, svc("frontend", svcNS), dns.TypeA), hasAddrs("10.250.4.2"))
}

// A Pod IP reused by a new Pod never carries the old Pod's imports: after a
// delete, and when the old Pod has finished (Succeeded) but still exists,
// whatever the order in which the events arrive.
func testIPReuse(t *testing.T, e *importsEnv) {
	svcNS, ns := e.a.NewNamespace(t), e.a.NewNamespace(t)
	exporters(t, e.a, svcNS, backend, "10.250.5.1")
	be := harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "be"}
	alias := func(a string) string { return svcIn(a, ns, clusterLocal) }

	// markerSeen makes sure the watch has delivered every earlier event: a
	// new importing Pod created last, whose alias shows once it is indexed
	// (one watch stream, events in order).
	marker := 0
	markerSeen := func() {
		t.Helper()
		marker++
		ip := "127.0.0." + strconv.Itoa(70+marker)
		name := fmt.Sprintf("marker-%d", marker)
		e.a.CreateReadyPods(t, ns, importer(name, ip, harness.ImportService{Name: "backend", Namespace: svcNS, Alias: name}))
		waitFor(t, e.dns, from(ip, alias(name), dns.TypeA), hasAddrs("10.250.5.1"))
	}

	// Deleted, then a new Pod on the same IP with no imports.
	const ip1 = "127.0.0.51"
	e.a.CreateReadyPods(t, ns, importer("old", ip1, be))
	waitFor(t, e.dns, from(ip1, alias("be"), dns.TypeA), hasAddrs("10.250.5.1"))
	e.a.DeletePod(t, ns, "old")
	waitFor(t, e.dns, from(ip1, alias("be"), dns.TypeA), isNXDOMAIN)
	e.a.CreateReadyPods(t, ns, importer("new", ip1))
	markerSeen()
	for _, z := range []string{zone, clusterLocal} {
		expect(t, e.dns, from(ip1, svcIn("be", ns, z), dns.TypeA), isNXDOMAIN)
	}

	// A new Pod (with an import of its own) takes the IP of an old one:
	// after the old one has finished (Succeeded, not deleted), and while the
	// old one still claims the IP as Running (events of two Pods, in either
	// order: the last claim wins). Then the old Pod is deleted, which
	// releases nothing of the new one's.
	mine := harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "mine"}
	for i, finished := range []bool{true, false} {
		ip := "127.0.0." + strconv.Itoa(52+i)
		old, nw := fmt.Sprintf("old-%d", i+2), fmt.Sprintf("new-%d", i+2)
		e.a.CreateReadyPods(t, ns, importer(old, ip, be))
		waitFor(t, e.dns, from(ip, alias("be"), dns.TypeA), hasAddrs("10.250.5.1"))
		if finished {
			e.a.SetPodStatus(t, ns, old, harness.PodStatus{Phase: "Succeeded"})
		}
		e.a.CreateReadyPods(t, ns, importer(nw, ip, mine))
		waitFor(t, e.dns, from(ip, alias("mine"), dns.TypeA), hasAddrs("10.250.5.1"))
		expect(t, e.dns, from(ip, alias("be"), dns.TypeA), isNXDOMAIN)
		e.a.DeletePod(t, ns, old)
		markerSeen()
		expect(t, e.dns, from(ip, alias("mine"), dns.TypeA), hasAddrs("10.250.5.1"))
		expect(t, e.dns, from(ip, alias("be"), dns.TypeA), isNXDOMAIN)
	}
}

// imports enforce, on a CoreDNS of its own: a Pod resolves services of its own
// namespace and the ones it imports; other services are NXDOMAIN; a client
// that is no known Pod is refused unless inside the allow CIDR; names that
// are not service names are never refused. Refusals are counted.
func testEnforce(t *testing.T, e *importsEnv) {
	metricsPort := harness.FreePort(t)
	d := harness.StartCoreDNS(t, enforceCorefile, map[string]string{
		"KUBECONFIG": e.a.Kubeconfig, "METRICS": strconv.Itoa(metricsPort)})
	nsA, nsB, ns := e.a.NewNamespace(t), e.a.NewNamespace(t), e.a.NewNamespace(t)
	// The exporter decides: nsA's backend lets ns resolve it, nsB's lets no other namespace.
	allowNS := backend
	allowNS.Allowed = []string{ns}
	exporters(t, e.a, nsA, allowNS, "10.250.6.1")
	exporters(t, e.a, nsB, backend, "10.250.6.2")
	own := harness.ExportService{Name: "own", Ports: []harness.ExportPort{{Name: "http", Port: 80}}}
	exporters(t, e.a, ns, own, "10.250.6.3")
	const me, inB, node = "127.0.0.61", "127.0.0.62", "127.0.0.90"
	// Two hostNetwork Pods, whose IP is their node's: it names no one Pod.
	// Created first: once the consumer (created after them) is known, so are they.
	for _, n := range []string{nsA, nsB} {
		p := harness.ImporterPod("node-agent", harness.ImportService{Name: "backend", Namespace: nsA, Alias: "be"}).Object(n)
		p.Spec.HostNetwork = true
		e.a.CreatePodObject(t, p)
		e.a.SetPodReady(t, n, "node-agent", true, node)
	}
	// The consumer also imports nsB's backend, which does not allow ns: an
	// import never grants access.
	e.a.CreateReadyPods(t, ns, importer("consumer", me, harness.ImportService{Name: "backend", Namespace: nsA, Alias: "be"},
		harness.ImportService{Name: "backend", Namespace: nsB, Alias: "beb"}))
	// A Pod with no importer label at all: enforce watches every Pod.
	e.a.CreateReadyPods(t, nsB, harness.ReadyPod{Pod: harness.Pod{Name: "plain"}, IPs: ips(inB)})

	// Allowed: what the exporter allows ns, the Pod's own namespace, the alias.
	waitFor(t, d, from(me, svc("backend", nsA), dns.TypeA), hasAddrs("10.250.6.1"))
	waitFor(t, d, from(me, svc("own", ns), dns.TypeA), hasAddrs("10.250.6.3"))
	expect(t, d, from(me, svcIn("be", ns, zone), dns.TypeA), hasAddrs("10.250.6.1"))
	expect(t, d, from(me, "_http._tcp."+svc("backend", nsA), dns.TypeSRV), hasSRVs("8080 "+host(dashed("10.250.6.1"), "backend", nsA)))
	waitFor(t, d, from(inB, svc("backend", nsB), dns.TypeA), hasAddrs("10.250.6.2"))
	// The allowed CIDR resolves everything.
	for _, n := range []string{svc("backend", nsA), svc("backend", nsB)} {
		expect(t, d, from(allowedIP, n, dns.TypeA), func(m *dns.Msg) error {
			if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
				return fmt.Errorf("rcode %s, %d answers: want one address", harness.Rcode(m), len(m.Answer))
			}
			return nil
		})
	}

	notAllowed := refusedCount(t, metricsPort, "not_allowed")
	unknown := refusedCount(t, metricsPort, "unknown_client")
	// Refused: what the Pod's namespace neither owns nor is allowed, in every
	// form of the name, the Pod's own import and alias of it included.
	for _, q := range []harness.Query{
		from(me, svc("backend", nsB), dns.TypeA),
		from(me, svcIn("beb", ns, zone), dns.TypeA),
		from(me, svc("backend", nsB), dns.TypeSRV),
		{Name: svc("backend", nsB), Type: dns.TypeA, Source: me, TCP: true},
		from(me, "_http._tcp."+svc("backend", nsB), dns.TypeSRV),
		from(me, host(dashed("10.250.6.2"), "backend", nsB), dns.TypeA),
		from(inB, svc("backend", nsA), dns.TypeA),
		from(inB, svc("own", ns), dns.TypeA),
	} {
		expect(t, d, q, isNXDOMAIN)
	}
	// Refused: clients that are no known Pod, outside the allowed CIDR (a
	// node's address among them, although hostNetwork Pods have it).
	for _, src := range []string{unknownIP, "", node} {
		expect(t, d, from(src, svc("backend", nsA), dns.TypeA), isNXDOMAIN)
		expect(t, d, from(src, svc("own", ns), dns.TypeA), isNXDOMAIN)
	}
	// Nor is a hostNetwork Pod's alias anyone's.
	expect(t, d, from(node, svcIn("be", nsA, zone), dns.TypeA), isNXDOMAIN)
	// Never refused: names that are not service names.
	expect(t, d, from(unknownIP, "dns-version."+zone, dns.TypeTXT), func(m *dns.Msg) error {
		if got := harness.TXTs(m); len(got) != 1 || got[0] != "1.0.0" {
			return fmt.Errorf("rcode %s, TXT %q", harness.Rcode(m), got)
		}
		return nil
	})
	expect(t, d, from(unknownIP, zone, dns.TypeSOA), func(m *dns.Msg) error {
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
			return fmt.Errorf("rcode %s, answer %v: want the SOA", harness.Rcode(m), m.Answer)
		}
		return nil
	})
	if got := refusedCount(t, metricsPort, "not_allowed") - notAllowed; got < 7 {
		t.Errorf("refused_total{reason=not_allowed} rose by %v, want at least 7", got)
	}
	if got := refusedCount(t, metricsPort, "unknown_client") - unknown; got < 6 {
		t.Errorf("refused_total{reason=unknown_client} rose by %v, want at least 6", got)
	}

	// The exporter's allowance opens the name (and the import's alias);
	// taken back, closes it. The consumer's import never changed.
	allowB := backend
	allowB.Allowed = []string{ns}
	e.a.SetPodAnnotation(t, nsB, "backend-0", harness.ExportAnnotation, harness.ExportJSON(allowB))
	waitFor(t, d, from(me, svc("backend", nsB), dns.TypeA), hasAddrs("10.250.6.2"))
	expect(t, d, from(me, svcIn("beb", ns, zone), dns.TypeA), hasAddrs("10.250.6.2"))
	expect(t, d, from(inB, svc("backend", nsB), dns.TypeA), hasAddrs("10.250.6.2")) // its own namespace still
	e.a.SetPodAnnotation(t, nsB, "backend-0", harness.ExportAnnotation, harness.ExportJSON(backend))
	waitFor(t, d, from(me, svc("backend", nsB), dns.TypeA), isNXDOMAIN)
	expect(t, d, from(me, svc("backend", nsA), dns.TypeA), hasAddrs("10.250.6.1"))

	// A Pod deleted is an unknown client again.
	e.a.DeletePod(t, nsB, "plain")
	waitFor(t, d, from(inB, svc("backend", nsB), dns.TypeA), isNXDOMAIN)
	if !d.Running() {
		t.Errorf("the enforcing CoreDNS exited")
	}
}

// refusedCount reads coredns_mcsannotations_refused_total for reason (summed
// over servers) from the prometheus endpoint; 0 when the series is absent.
func refusedCount(t *testing.T, port int, reason string) float64 {
	t.Helper()
	return metricSum(t, port, "coredns_mcsannotations_refused_total", `reason="`+reason+`"`)
}

// Behind the cache plugin, the answers stay per client: one client's alias
// answer, the kubernetes plugin's answer to another, an allowed answer and a
// refusal are each served to their own client only, each asked right after
// the other (a cache keyed on the name would keep each for at least 5 s).
func testCache(t *testing.T, e *importsEnv) {
	d := harness.StartCoreDNS(t, cachedCorefile, map[string]string{"KUBECONFIG": e.a.Kubeconfig})
	svcNS, ns, otherNS := e.a.NewNamespace(t), e.a.NewNamespace(t), e.a.NewNamespace(t)
	allowNS := backend
	allowNS.Allowed = []string{ns} // the neighbour's namespace is not allowed
	exporters(t, e.a, svcNS, allowNS, "10.250.7.1")
	webIP := e.a.CreateClusterIPService(t, ns, "web")
	const me, other = "127.0.0.81", "127.0.0.82"
	e.a.CreateReadyPods(t, ns, importer("consumer", me, harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "web"}))
	e.a.CreateReadyPods(t, otherNS, importer("neighbour", other))
	web := svcIn("web", ns, clusterLocal)
	waitFor(t, d, from(other, web, dns.TypeA), hasAddrs(webIP))
	waitFor(t, d, from(me, web, dns.TypeA), hasAddrs("10.250.7.1"))
	waitFor(t, d, from(me, svc("backend", svcNS), dns.TypeA), hasAddrs("10.250.7.1"))
	for i := 0; i < 2; i++ { // each answer right after the other client's
		expect(t, d, from(other, web, dns.TypeA), hasAddrs(webIP))
		expect(t, d, from(me, web, dns.TypeA), hasAddrs("10.250.7.1"))
		expect(t, d, from(other, svc("backend", svcNS), dns.TypeA), isNXDOMAIN)
		expect(t, d, from(me, svc("backend", svcNS), dns.TypeA), hasAddrs("10.250.7.1"))
		expect(t, d, from(other, svcIn("web", ns, zone), dns.TypeA), isNXDOMAIN)
		expect(t, d, from(me, svcIn("web", ns, zone), dns.TypeA), hasAddrs("10.250.7.1"))
	}
}

// offlineImportsCorefile is imports enforce with a snapshot.
const offlineImportsCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        snapshot {DIR}/table.db
        ttl 5
        imports enforce
    }
}
`

// TestImportsOfflineRestart: CoreDNS restarted while the API server is
// down still knows who imports what (the snapshot keeps the local Pods as
// DNS clients): the importing Pod's alias and its imported service answer it
// from the first query, and imports enforce still refuses a Pod of a
// namespace the exporter does not allow. Its own cluster, since it kills the API server.
func TestImportsOfflineRestart(t *testing.T) {
	harness.RequireTools(t)
	c := harness.StartCluster(t, clusterID)
	d := harness.StartCoreDNS(t, offlineImportsCorefile, map[string]string{"KUBECONFIG": c.Kubeconfig})
	svcNS, ns, otherNS := c.NewNamespace(t), c.NewNamespace(t), c.NewNamespace(t)
	allowNS := backend
	allowNS.Allowed = []string{ns}
	exporters(t, c, svcNS, allowNS, "10.250.9.1")
	const me, stranger = "127.0.0.91", "127.0.0.92"
	c.CreateReadyPods(t, ns, importer("consumer", me, harness.ImportService{Name: "backend", Namespace: svcNS, Alias: "be"}))
	c.CreateReadyPods(t, otherNS, harness.ReadyPod{Pod: harness.Pod{Name: "stranger"}, IPs: ips(stranger)})
	want := hasAddrs("10.250.9.1")
	waitFor(t, d, from(me, svcIn("be", ns, zone), dns.TypeA), want)
	waitFor(t, d, from(stranger, svc("backend", svcNS), dns.TypeA), isNXDOMAIN)
	expect(t, d, from(me, svc("backend", svcNS), dns.TypeA), want)
	time.Sleep(500 * time.Millisecond) // the snapshot's batch writer commits every 100 ms

	c.KillAPIServer(t, syscall.SIGKILL)
	d.Restart(t)
	// The first answers after the restart, with no API server: no waiting.
	expect(t, d, from(me, svcIn("be", ns, zone), dns.TypeA), want)
	expect(t, d, from(me, svc("backend", svcNS), dns.TypeA), want)
	expect(t, d, from(stranger, svc("backend", svcNS), dns.TypeA), isNXDOMAIN)
	expect(t, d, from(unknownIP, svc("backend", svcNS), dns.TypeA), isNXDOMAIN)
	if err := c.Ready(); err == nil {
		t.Fatal("the API server answers again: the test proved nothing")
	}
}
