// Package e2e tests the real bin/coredns with mcsannotations compiled in
// against real kube-apiservers started by the harness. See test/README.md.
package e2e

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// corefile is the plugin's Corefile for one cluster, edge-a.
const corefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        ttl 5
    }
}
`

const (
	zone      = "clusterset.local."
	clusterID = "edge-a"
	ttl       = 5
	// propagation bounds how long a change in the API may take to show in DNS.
	propagation = 10 * time.Second
)

// backend is the exported service most tests use: port http 80 -> 8080/TCP.
var backend = harness.ExportService{Name: "backend",
	Ports: []harness.ExportPort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}

// env is one cluster and one CoreDNS reading it.
type env struct {
	c   *harness.Cluster
	dns *harness.CoreDNS
}

// newEnv starts cluster edge-a and CoreDNS with the plugin pointed at it.
func newEnv(t *testing.T) *env {
	t.Helper()
	harness.RequireTools(t) // skip (or fail under CI) before starting anything
	c := harness.StartCluster(t, clusterID)
	d := harness.StartCoreDNS(t, corefile, map[string]string{"KUBECONFIG": c.Kubeconfig})
	t.Cleanup(func() {
		if !d.Running() {
			_, err := d.Process().Exited()
			t.Errorf("CoreDNS exited during the test (%v)", err)
		}
	})
	return &env{c: c, dns: d}
}

// svc is the clusterset name of a service.
func svc(name, ns string) string { return name + "." + ns + ".svc." + zone }

// host is the clusterset name of one endpoint of a service in edge-a.
func host(hostname, name, ns string) string {
	return hostname + "." + clusterID + "." + svc(name, ns)
}

// dashed is the hostname of an endpoint whose Pod has no spec.hostname.
func dashed(ip string) string { return strings.NewReplacer(".", "-", ":", "-").Replace(ip) }

// exporter is a Ready Pod exporting svcs.
func exporter(name, hostname string, ips []string, svcs ...harness.ExportService) harness.ReadyPod {
	return harness.ReadyPod{Pod: harness.ExporterPod(name, hostname, svcs...), IPs: ips}
}

func ips(s ...string) []string { return s }

// query asks CoreDNS, over UDP unless tcp.
func (e *env) query(name string, qtype uint16, tcp bool) (*dns.Msg, error) {
	return e.dns.Exchange(harness.Query{Name: name, Type: qtype, TCP: tcp})
}

// eventually polls a query until check accepts its answer, or fails the test
// after propagation.
func (e *env) eventually(t *testing.T, q harness.Query, check func(*dns.Msg) error) *dns.Msg {
	t.Helper()
	var last *dns.Msg
	took := harness.Eventually(t, propagation, func() error {
		m, err := e.dns.Exchange(q)
		if err != nil {
			return err
		}
		last = m
		if err := check(m); err != nil {
			return fmt.Errorf("%s %s: %w\n%s", q.Name, dns.TypeToString[q.Type], err, m)
		}
		return nil
	})
	t.Logf("%s %s as expected after %s", q.Name, dns.TypeToString[q.Type], took.Round(time.Millisecond))
	return last
}

// eventuallyAddrs waits until name's A (or AAAA) answer is exactly want;
// an empty want means NXDOMAIN with an SOA.
func (e *env) eventuallyAddrs(t *testing.T, name string, qtype uint16, want ...string) *dns.Msg {
	t.Helper()
	if len(want) == 0 {
		return e.eventually(t, harness.Query{Name: name, Type: qtype}, isNXDOMAIN)
	}
	return e.eventually(t, harness.Query{Name: name, Type: qtype}, hasAddrs(want...))
}

// consistently checks for d that a query keeps giving an accepted answer.
func (e *env) consistently(t *testing.T, d time.Duration, q harness.Query, check func(*dns.Msg) error) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		m, err := e.dns.Exchange(q)
		if err == nil {
			err = check(m)
		}
		if err != nil {
			t.Fatalf("%s %s: %v\n%v", q.Name, dns.TypeToString[q.Type], err, m)
		}
	}
}

// hasAddrs accepts NOERROR with exactly these A/AAAA addresses in the answer.
func hasAddrs(want ...string) func(*dns.Msg) error {
	want = append([]string(nil), want...)
	sort.Strings(want)
	return func(m *dns.Msg) error {
		if m.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("rcode %s, want NOERROR with %v", harness.Rcode(m), want)
		}
		if got := harness.Addrs(m); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("addresses %v, want %v", got, want)
		}
		return nil
	}
}

// isNXDOMAIN accepts NXDOMAIN with an SOA in the authority section and no answer.
func isNXDOMAIN(m *dns.Msg) error {
	if m.Rcode != dns.RcodeNameError {
		return fmt.Errorf("rcode %s (answer %v), want NXDOMAIN", harness.Rcode(m), m.Answer)
	}
	if len(m.Answer) != 0 {
		return fmt.Errorf("NXDOMAIN with answers %v", m.Answer)
	}
	if !harness.HasSOA(m) {
		return fmt.Errorf("NXDOMAIN without SOA in authority")
	}
	return nil
}

// isNoData accepts NOERROR with an empty answer and an SOA in authority.
func isNoData(m *dns.Msg) error {
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		return fmt.Errorf("rcode %s with %d answers, want NOERROR with none", harness.Rcode(m), len(m.Answer))
	}
	if !harness.HasSOA(m) {
		return fmt.Errorf("no-data answer without SOA in authority")
	}
	return nil
}

// hasSRVs accepts NOERROR with exactly these SRV records ("port target").
func hasSRVs(want ...string) func(*dns.Msg) error {
	want = append([]string(nil), want...)
	sort.Strings(want)
	return func(m *dns.Msg) error {
		if m.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("rcode %s, want NOERROR with SRV %v", harness.Rcode(m), want)
		}
		if got := harness.SRVs(m); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("SRV %v, want %v", got, want)
		}
		return nil
	}
}
