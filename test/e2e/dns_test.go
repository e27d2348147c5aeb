package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestDNS runs the core DNS scenarios against one cluster (edge-a) and one
// CoreDNS, each subtest in a fresh namespace. Run one alone with
// -run 'TestDNS/PodAdded'.
func TestDNS(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *env)
	}{
		{"DNSVersion", testDNSVersion},
		{"PodAdded", testPodAdded},
		{"PodIPChanged", testPodIPChanged},
		{"PodNotReady", testPodNotReady},
		{"PodDeleted", testPodDeleted},
		{"TwoServices", testTwoServices},
		{"SRV", testSRV},
		{"TCP", testTCP},
		{"Truncation", testTruncation},
		{"MalformedAnnotation", testMalformedAnnotation},
		{"DualStack", testDualStack},
		{"NegativeAnswers", testNegativeAnswers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !e.dns.Running() {
				t.Fatalf("CoreDNS is not running (it exited in an earlier subtest)")
			}
			tc.f(t, e)
		})
	}
}

// dns-version.<zone> TXT "1.0.0" (KEP-1645 schema version).
func testDNSVersion(t *testing.T, e *env) {
	m := e.eventually(t, harness.Query{Name: "dns-version." + zone, Type: dns.TypeTXT}, func(m *dns.Msg) error {
		if m.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("rcode %s", harness.Rcode(m))
		}
		if got := harness.TXTs(m); len(got) != 1 || got[0] != "1.0.0" {
			return fmt.Errorf("TXT %q, want [1.0.0]", got)
		}
		return nil
	})
	if !m.Authoritative {
		t.Errorf("dns-version answer is not authoritative")
	}
}

// A Pod that turns Ready appears; one still Pending does not; TTL is the configured one.
func testPodAdded(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	name := svc("backend", ns)
	e.eventuallyAddrs(t, name, dns.TypeA) // nothing exported yet: NXDOMAIN + SOA

	e.c.CreateReadyPods(t, ns, exporter("web-1", "", ips("10.244.1.1"), backend))
	m := e.eventuallyAddrs(t, name, dns.TypeA, "10.244.1.1")
	for _, rr := range m.Answer {
		if rr.Header().Ttl != ttl {
			t.Errorf("TTL %d, want %d: %v", rr.Header().Ttl, ttl, rr)
		}
	}

	// A Pending Pod (no IP, not Ready) created before the second Ready one:
	// when the second shows, the Pending one must not.
	e.c.CreatePod(t, ns, harness.ExporterPod("web-pending", "", backend))
	e.c.CreateReadyPods(t, ns, exporter("web-2", "", ips("10.244.1.2"), backend))
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.1.1", "10.244.1.2")

	// Becoming Ready later makes it appear.
	e.c.SetPodReady(t, ns, "web-pending", true, "10.244.1.3")
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.1.1", "10.244.1.2", "10.244.1.3")
}

// A changed Pod IP replaces the old one, in the service and per-endpoint names.
func testPodIPChanged(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	name := svc("backend", ns)
	e.c.CreateReadyPods(t, ns,
		exporter("web-1", "", ips("10.244.2.1"), backend),
		exporter("web-2", "", ips("10.244.2.2"), backend))
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.2.1", "10.244.2.2")
	e.eventuallyAddrs(t, host(dashed("10.244.2.1"), "backend", ns), dns.TypeA, "10.244.2.1")

	e.c.SetPodReady(t, ns, "web-1", true, "10.244.2.9")
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.2.2", "10.244.2.9")
	e.eventuallyAddrs(t, host(dashed("10.244.2.9"), "backend", ns), dns.TypeA, "10.244.2.9")
	e.eventuallyAddrs(t, host(dashed("10.244.2.1"), "backend", ns), dns.TypeA) // gone: NXDOMAIN
}

// A Pod that stops being Ready disappears; with no ready endpoint left the
// name is NXDOMAIN; Ready again brings it back.
func testPodNotReady(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	name := svc("backend", ns)
	e.c.CreateReadyPods(t, ns,
		exporter("web-1", "", ips("10.244.3.1"), backend),
		exporter("web-2", "", ips("10.244.3.2"), backend))
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.3.1", "10.244.3.2")

	e.c.SetPodReady(t, ns, "web-1", false)
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.3.2")
	e.eventuallyAddrs(t, host(dashed("10.244.3.1"), "backend", ns), dns.TypeA)

	e.c.SetPodReady(t, ns, "web-2", false)
	e.eventuallyAddrs(t, name, dns.TypeA) // no ready endpoint: NXDOMAIN + SOA

	e.c.SetPodReady(t, ns, "web-1", true)
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.3.1")
}

// A deleted Pod disappears; the last one gone makes the name NXDOMAIN.
func testPodDeleted(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	name := svc("backend", ns)
	e.c.CreateReadyPods(t, ns,
		exporter("web-1", "", ips("10.244.4.1"), backend),
		exporter("web-2", "", ips("10.244.4.2"), backend))
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.4.1", "10.244.4.2")

	e.c.DeletePod(t, ns, "web-1")
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.4.2")
	e.c.DeletePod(t, ns, "web-2")
	e.eventuallyAddrs(t, name, dns.TypeA)
	e.eventuallyAddrs(t, host(dashed("10.244.4.2"), "backend", ns), dns.TypeA)
}

// One Pod backing two services answers under both names; removing one service
// from its annotation removes it from that name only.
func testTwoServices(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	frontend := harness.ExportService{Name: "frontend",
		Ports: []harness.ExportPort{{Name: "grpc", Port: 9090, TargetPort: 9091, Protocol: "TCP"}}}
	e.c.CreateReadyPods(t, ns,
		exporter("both", "", ips("10.244.5.1"), backend, frontend),
		exporter("backend-only", "", ips("10.244.5.2"), backend))
	e.eventuallyAddrs(t, svc("backend", ns), dns.TypeA, "10.244.5.1", "10.244.5.2")
	e.eventuallyAddrs(t, svc("frontend", ns), dns.TypeA, "10.244.5.1")
	e.eventually(t, harness.Query{Name: "_grpc._tcp." + svc("frontend", ns), Type: dns.TypeSRV},
		hasSRVs("9091 "+host(dashed("10.244.5.1"), "frontend", ns)))

	e.c.SetPodAnnotation(t, ns, "both", harness.ExportAnnotation, harness.ExportJSON(frontend))
	e.eventuallyAddrs(t, svc("backend", ns), dns.TypeA, "10.244.5.2")
	e.eventuallyAddrs(t, svc("frontend", ns), dns.TypeA, "10.244.5.1")
}

// SRV per named port: target <hostname>.<cluster>.<svc>..., port = targetPort,
// hostname = spec.hostname or the dashed IP; addresses in the additional
// section; the per-endpoint names answer A.
func testSRV(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	web := harness.ExportService{Name: "backend", Ports: []harness.ExportPort{
		{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"},
		{Name: "metrics", Port: 9100}, // targetPort defaults to port, protocol to TCP
	}}
	e.c.CreateReadyPods(t, ns,
		exporter("web-0", "web-0", ips("10.244.6.1"), web),
		exporter("web-x", "", ips("10.244.6.2"), web))
	named, anon := host("web-0", "backend", ns), host("10-244-6-2", "backend", ns)

	m := e.eventually(t, harness.Query{Name: "_http._tcp." + svc("backend", ns), Type: dns.TypeSRV},
		hasSRVs("8080 "+named, "8080 "+anon))
	if got, want := harness.ExtraAddrs(m), []string{anon + " 10.244.6.2", named + " 10.244.6.1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("additional section %v, want %v", got, want)
	}
	e.eventually(t, harness.Query{Name: "_metrics._tcp." + svc("backend", ns), Type: dns.TypeSRV},
		hasSRVs("9100 "+named, "9100 "+anon))
	// The bare service name: one record per ready endpoint and named port.
	e.eventually(t, harness.Query{Name: svc("backend", ns), Type: dns.TypeSRV},
		hasSRVs("8080 "+named, "8080 "+anon, "9100 "+named, "9100 "+anon))

	e.eventuallyAddrs(t, named, dns.TypeA, "10.244.6.1")
	e.eventuallyAddrs(t, anon, dns.TypeA, "10.244.6.2")
}

// The same answers over TCP as over UDP.
func testTCP(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	e.c.CreateReadyPods(t, ns,
		exporter("web-0", "web-0", ips("10.244.7.1"), backend),
		exporter("web-1", "", ips("10.244.7.2"), backend))
	e.eventuallyAddrs(t, svc("backend", ns), dns.TypeA, "10.244.7.1", "10.244.7.2")

	e.eventually(t, harness.Query{Name: svc("backend", ns), Type: dns.TypeA, TCP: true},
		hasAddrs("10.244.7.1", "10.244.7.2"))
	e.eventually(t, harness.Query{Name: "_http._tcp." + svc("backend", ns), Type: dns.TypeSRV, TCP: true},
		hasSRVs("8080 "+host("web-0", "backend", ns), "8080 "+host("10-244-7-2", "backend", ns)))
	e.eventually(t, harness.Query{Name: host("web-0", "backend", ns), Type: dns.TypeA, TCP: true},
		hasAddrs("10.244.7.1"))
	e.eventually(t, harness.Query{Name: svc("nothing", ns), Type: dns.TypeA, TCP: true}, isNXDOMAIN)
	e.eventually(t, harness.Query{Name: "dns-version." + zone, Type: dns.TypeTXT, TCP: true}, func(m *dns.Msg) error {
		if got := harness.TXTs(m); len(got) != 1 || got[0] != "1.0.0" {
			return fmt.Errorf("TXT %q", got)
		}
		return nil
	})
}

// 60 endpoints do not fit a 512-byte UDP answer: TC is set over plain UDP; TCP
// and UDP with an EDNS0 buffer of 4096 carry all 60.
func testTruncation(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	const n = 60
	var pods []harness.ReadyPod
	var want []string
	for i := 1; i <= n; i++ {
		ip := "10.244.8." + strconv.Itoa(i)
		pods = append(pods, exporter(fmt.Sprintf("web-%02d", i), "", ips(ip), backend))
		want = append(want, ip)
	}
	start := time.Now()
	e.c.CreateReadyPods(t, ns, pods...)
	t.Logf("created %d Ready Pods in %s", n, time.Since(start).Round(time.Millisecond))
	name := svc("backend", ns)
	e.eventually(t, harness.Query{Name: name, Type: dns.TypeA, TCP: true}, hasAddrs(want...))

	m, wire, err := harness.ExchangeWire(e.dns.Addr(), harness.Query{Name: name, Type: dns.TypeA})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Truncated {
		t.Errorf("UDP answer with %d endpoints: TC not set (%d answers)", n, len(m.Answer))
	}
	if len(wire) > dns.MinMsgSize {
		t.Errorf("UDP answer is %d bytes, over %d", len(wire), dns.MinMsgSize)
	}
	t.Logf("plain UDP: TC %v, %d bytes, %d of %d addresses", m.Truncated, len(wire), len(m.Answer), n)
	m, err = e.dns.Exchange(harness.Query{Name: name, Type: dns.TypeA, UDPSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := hasAddrs(want...)(m); err != nil || m.Truncated {
		t.Errorf("UDP with EDNS0 4096: TC %v, %v", m.Truncated, err)
	}
	if m.IsEdns0() == nil {
		t.Errorf("answer to an EDNS0 query has no OPT record")
	}
	// SRV answers are larger still: truncated over UDP, whole over TCP.
	srvName := "_http._tcp." + name
	if m, err := e.query(srvName, dns.TypeSRV, false); err != nil || !m.Truncated {
		t.Errorf("SRV over UDP: err %v, truncated %v", err, m != nil && m.Truncated)
	}
	if m, err := e.query(srvName, dns.TypeSRV, true); err != nil || len(harness.SRVs(m)) != n {
		t.Errorf("SRV over TCP: err %v, %d records, want %d", err, len(harness.SRVs(m)), n)
	}
}

// Bad annotations on some Pods beside good ones: the good ones answer, the bad
// entries are skipped, CoreDNS keeps running, and a fixed annotation is taken.
func testMalformedAnnotation(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	name := svc("backend", ns)
	bad := func(pod, ip, annotation string) harness.ReadyPod {
		p := exporter(pod, "", ips(ip))
		p.Annotations[harness.ExportAnnotation] = annotation
		return p
	}
	e.c.CreateReadyPods(t, ns, exporter("good-1", "", ips("10.244.9.1"), backend))
	e.c.CreateReadyPods(t, ns,
		bad("bad-json", "10.244.9.3", `{"services":[{"name":"backend",`),
		bad("bad-shape", "10.244.9.4", `{"services":"backend"}`),
		bad("bad-port", "10.244.9.5", `{"services":[{"name":"backend","ports":[{"name":"http","port":70000}]}]}`),
		bad("bad-protocol", "10.244.9.6", `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"protocol":"ICMP"}]}]}`),
		bad("bad-namespace", "10.244.9.7", `{"services":[{"name":"backend","namespace":"someone-else","ports":[{"name":"http","port":80}]}]}`),
		bad("bad-cluster", "10.244.9.8", `{"services":[{"name":"backend","cluster":"edge-b","ports":[{"name":"http","port":80}]}]}`),
		bad("bad-name", "10.244.9.9", `{"services":[{"name":"Back_End!","ports":[{"name":"http","port":80}]}]}`),
	)
	// Created after the bad ones: once it shows, they have been seen.
	e.c.CreateReadyPods(t, ns, exporter("good-2", "", ips("10.244.9.2"), backend))
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.9.1", "10.244.9.2")
	e.consistently(t, time.Second, harness.Query{Name: name, Type: dns.TypeA}, hasAddrs("10.244.9.1", "10.244.9.2"))
	e.eventually(t, harness.Query{Name: "_http._tcp." + name, Type: dns.TypeSRV},
		hasSRVs("8080 "+host("10-244-9-1", "backend", ns), "8080 "+host("10-244-9-2", "backend", ns)))
	if !e.dns.Running() {
		t.Fatalf("CoreDNS exited on malformed annotations")
	}

	// The bad Pod's annotation fixed: it is taken up.
	e.c.SetPodAnnotation(t, ns, "bad-json", harness.ExportAnnotation, harness.ExportJSON(backend))
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.9.1", "10.244.9.2", "10.244.9.3")
	// And broken again: it goes, the others stay.
	e.c.SetPodAnnotation(t, ns, "bad-json", harness.ExportAnnotation, `not json at all`)
	e.eventuallyAddrs(t, name, dns.TypeA, "10.244.9.1", "10.244.9.2")
	if !e.dns.Running() {
		t.Fatalf("CoreDNS exited on malformed annotations")
	}
}

// A and AAAA cover the same endpoints: a dual-stack Pod answers both, an IPv4
// Pod only A; a service with no IPv6 endpoint answers AAAA with no data.
func testDualStack(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	e.c.CreateReadyPods(t, ns,
		exporter("dual", "dual", ips("10.244.10.1", "fd00:10:244::a1"), backend),
		exporter("v4only", "v4only", ips("10.244.10.2"), harness.ExportService{Name: "legacy",
			Ports: []harness.ExportPort{{Name: "http", Port: 80}}}))
	e.eventuallyAddrs(t, svc("backend", ns), dns.TypeA, "10.244.10.1")
	e.eventuallyAddrs(t, svc("backend", ns), dns.TypeAAAA, "fd00:10:244::a1")
	e.eventuallyAddrs(t, host("dual", "backend", ns), dns.TypeAAAA, "fd00:10:244::a1")
	e.eventuallyAddrs(t, svc("legacy", ns), dns.TypeA, "10.244.10.2")
	e.eventually(t, harness.Query{Name: svc("legacy", ns), Type: dns.TypeAAAA}, isNoData)
}

// Unknown names are NXDOMAIN with SOA; a known name asked for another type
// gets no data; <cluster>.<svc>... is reserved; names are case-insensitive.
func testNegativeAnswers(t *testing.T, e *env) {
	ns := e.c.NewNamespace(t)
	e.c.CreateReadyPods(t, ns, exporter("web-0", "web-0", ips("10.244.11.1"), backend))
	e.eventuallyAddrs(t, svc("backend", ns), dns.TypeA, "10.244.11.1")

	for _, name := range []string{
		svc("unknown", ns),
		svc("backend", "no-such-namespace"),
		clusterID + "." + svc("backend", ns), // reserved by the spec
		host("web-9", "backend", ns),
		"nothing-here." + zone,
	} {
		m, err := e.query(name, dns.TypeA, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := isNXDOMAIN(m); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	m, err := e.query(svc("backend", ns), dns.TypeMX, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := isNoData(m); err != nil {
		t.Errorf("backend MX: %v", err)
	}
	m, err = e.query("BackEnd."+ns+".SVC.ClusterSet.Local.", dns.TypeA, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := hasAddrs("10.244.11.1")(m); err != nil {
		t.Errorf("mixed-case name: %v", err)
	}
}
