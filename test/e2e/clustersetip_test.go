package e2e

// ClusterSetIP services (docs/DESIGN.md#answer-rules, KEP-1645 DNS
// specification 1.0.0): the real bin/coredns against a real kube-apiserver
// with the mcs-api CRDs. A service whose local ServiceImport is of type
// ClusterSetIP with spec.ips answers those IPs instead of its endpoints, and
// keeps answering them from the snapshot after a restart while the API server
// is down.

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

const clusterSetIP = "10.96.100.1"

func createClusterSetIPImport(t *testing.T, c *harness.Cluster, ns, name string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"type":  "ClusterSetIP",
		"ips":   []any{clusterSetIP},
		"ports": []any{map[string]any{"name": "http", "port": int64(80), "protocol": "TCP"}},
	}}}
	u.SetAPIVersion(harness.MCSGroup + "/v1beta1")
	u.SetKind("ServiceImport")
	u.SetNamespace(ns)
	u.SetName(name)
	gvr := schema.GroupVersionResource{Group: harness.MCSGroup, Version: "v1beta1", Resource: "serviceimports"}
	if _, err := c.Dynamic(t).Resource(gvr).Namespace(ns).Create(t.Context(), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceImport %s/%s: %v", ns, name, err)
	}
}

func TestClusterSetIP(t *testing.T) {
	harness.RequireTools(t)
	c := harness.StartCluster(t, clusterID)
	c.InstallMCSCRDs(t)
	ns := c.NewNamespace(t)
	eps := []endpoint{{"web-0", "web-0", "10.250.3.1"}}
	createEndpoints(t, c, ns, eps...)

	d, readyURL := startOfflineCoreDNS(t, c.Kubeconfig, snapshotPath(t), "")
	name := svc("backend", ns)
	q := func(name string, qtype uint16) harness.Query {
		return harness.Query{Name: name, Type: qtype, UDPSize: 4096, Timeout: offlineQueryTimeout}
	}
	// Headless while there is no ServiceImport.
	waitEndpoints(t, d, ns, initialSync, eps...)

	createClusterSetIPImport(t, c, ns, "backend")
	check := func(t *testing.T) {
		t.Helper()
		eventuallyWithin(t, d, propagation, q(name, dns.TypeA), hasAddrs(clusterSetIP))
		eventuallyWithin(t, d, propagation, q(name, dns.TypeAAAA), isNoData)
		m, _ := eventuallyWithin(t, d, propagation, q("_http._tcp."+name, dns.TypeSRV), hasSRVs("80 "+name))
		if got, want := harness.ExtraAddrs(m), name+" "+clusterSetIP; len(got) != 1 || got[0] != want {
			t.Errorf("SRV additional addresses %q, want [%q]", got, want)
		}
		eventuallyWithin(t, d, propagation, q(name, dns.TypeSRV), hasSRVs("80 "+name))
		eventuallyWithin(t, d, propagation, q("_dns._udp."+name, dns.TypeSRV), isNXDOMAIN)
		// Per-endpoint names keep answering.
		eventuallyWithin(t, d, propagation, q(eps[0].target(ns), dns.TypeA), hasAddrs(eps[0].ip))
	}
	check(t)
	waitReady(t, readyURL, 10*time.Second)
	// The snapshot is written in batches every 100 ms.
	time.Sleep(time.Second)

	c.KillAPIServer(t, syscall.SIGKILL)
	requireAPIDown(t, c)
	check(t) // kept while the API server is unreachable

	d.Kill(t, syscall.SIGTERM)
	d.Start(t)
	requireAPIDown(t, c)
	// From the first query after the restart, with no API server.
	m, err := d.Exchange(q(name, dns.TypeA))
	if err != nil {
		t.Fatal(err)
	}
	if err := hasAddrs(clusterSetIP)(m); err != nil {
		t.Fatalf("first answer after an offline restart: %v\n%v", err, m)
	}
	check(t)
	logPluginLines(t, d, "ServiceImport", "ClusterSetIP")
}

// isPending accepts what a service exported as ClusterSetIP answers while its
// ClusterSetIP is not known and ServiceImports are served: NOERROR, no
// answer, an SOA whose TTL and minimum (the negative TTL) are a few seconds.
func isPending(m *dns.Msg) error {
	if err := isNoData(m); err != nil {
		return err
	}
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok && (soa.Hdr.Ttl > 5 || soa.Minttl > 5) {
			return fmt.Errorf("negative TTL %d/%d, want at most 5", soa.Hdr.Ttl, soa.Minttl)
		}
	}
	return nil
}

// pendingOrAddrs accepts isPending or exactly these addresses: a ClusterSetIP
// service answers its endpoints' addresses while the plugin has not yet seen
// that ServiceImports are served (it looks every 30 s), NODATA from then on.
func pendingOrAddrs(want ...string) func(*dns.Msg) error {
	addrs := hasAddrs(want...)
	return func(m *dns.Msg) error {
		if err := addrs(m); err != nil && isPending(m) != nil {
			return fmt.Errorf("%v, and not pending either", err)
		}
		return nil
	}
}
