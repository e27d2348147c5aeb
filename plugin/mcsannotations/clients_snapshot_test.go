package mcsannotations

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
)

func enforcedSnapshotCorefile(path string) string {
	return `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig /unused-in-this-test
        snapshot ` + path + `
        imports enforce
    }
}`
}

// askFrom sends one A query from a chosen local address.
func askFrom(t *testing.T, udp, src, qname string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(qname, dns.TypeA)
	c := &dns.Client{Timeout: 2 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}}
	r, _, err := c.Exchange(m, udp)
	if err != nil {
		t.Fatalf("%s from %s: %v", qname, src, err)
	}
	return r
}

// After a restart while the API server is unreachable, the snapshot still
// knows who imports what and which namespaces a service allows: an importing
// Pod's alias answers it from the first query, and imports enforce still
// tells it from strangers.
func TestSnapshotKeepsClientsForOfflineRestart(t *testing.T) {
	const consumer = "127.0.0.5"
	consumerPod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "web", ResourceVersion: "1",
			Labels:      map[string]string{annotation.ImporterLabel: "true"},
			Annotations: map[string]string{annotation.ImportAnnotation: `{"services":[{"name":"backend","namespace":"default","alias":"be"}]}`}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: consumer}}},
	}
	path := filepath.Join(t.TempDir(), "table.db")
	// backend allows web: the allowed list too must come back from the snapshot.
	const allowsWeb = `{"services":[{"name":"backend","ports":[{"name":"http","port":80}],"allowedNamespaces":["web"]}]}`
	withClient(t, fakeAPI(exporter("b1", "10.0.0.1", allowsWeb), consumerPod))
	i, udp, _, err := coretest.CoreDNSServerAndPorts(enforcedSnapshotCorefile(path))
	if err != nil {
		t.Fatal(err)
	}
	const backend, alias = "backend.default.svc.clusterset.local.", "be.web.svc.clusterset.local."
	for deadline := time.Now().Add(5 * time.Second); len(askFrom(t, udp, consumer, alias).Answer) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the alias never answered while online")
		}
	}
	stopServer(i) // flushes the snapshot

	withClient(t, deadAPI)
	i, udp, _, err = coretest.CoreDNSServerAndPorts(enforcedSnapshotCorefile(path))
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)
	for _, q := range []string{alias, backend} {
		if r := askFrom(t, udp, consumer, q); len(r.Answer) != 1 || addrsOf(r)[0] != "10.0.0.1" {
			t.Errorf("%s from the importing Pod after an offline restart: %v", q, r)
		}
	}
	if r := askFrom(t, udp, "127.0.0.1", backend); r.Rcode != dns.RcodeNameError {
		t.Errorf("%s from a stranger after an offline restart: %v, want NXDOMAIN (refused)", backend, r)
	}
}
