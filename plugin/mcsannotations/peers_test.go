package mcsannotations

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"

	"github.com/miekg/dns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func peersCorefile(extra string) string {
	return `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge-a
        kubeconfig /edge-a
        peer edge-b /edge-b
        peer edge-c /edge-c
` + extra + `
    }
}`
}

// byKubeconfig serves each cluster's client by its kubeconfig path.
func byKubeconfig(clients map[string]kubernetes.Interface) func(string, string) (kubernetes.Interface, error) {
	return func(path, _ string) (kubernetes.Interface, error) {
		if c, ok := clients[path]; ok {
			return c, nil
		}
		return deadAPI(path, "")
	}
}

func TestPeersUnionLocalityAndClaims(t *testing.T) {
	withClient(t, byKubeconfig(map[string]kubernetes.Interface{
		"/edge-a": fake.NewClientset(exporter("a1", "10.0.0.1", backendAnno)),
		"/edge-b": fake.NewClientset(exporter("b1", "10.1.0.1", backendAnno), exporter("db1", "10.1.0.5", `{"services":[{"name":"db"}]}`),
			// A Pod in edge-b claiming to be in edge-a: rejected.
			exporter("liar", "10.1.0.66", `{"services":[{"name":"db","cluster":"edge-a"}]}`)),
		"/edge-c": fake.NewClientset(exporter("c1", "10.2.0.1", backendAnno), exporter("db2", "10.2.0.5", `{"services":[{"name":"db"}]}`)),
	}))
	before := testutil.ToFloat64(rejectedAnnotations.WithLabelValues("edge-b", "cluster_mismatch"))
	i, udp, _, err := coretest.CoreDNSServerAndPorts(peersCorefile(""))
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)
	// Local endpoints win for backend; db exists only in peers: their union.
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})
	waitAnswer(t, udp, "db.default.svc.clusterset.local.", []string{"10.1.0.5", "10.2.0.5"})
	// Per-cluster endpoint names cover every cluster.
	waitAnswer(t, udp, "10-2-0-1.edge-c.backend.default.svc.clusterset.local.", []string{"10.2.0.1"})
	r := exchange(t, "udp", udp, "10-1-0-66.edge-a.db.default.svc.clusterset.local.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("the lying Pod got a name: %v", r)
	}
	if got := testutil.ToFloat64(rejectedAnnotations.WithLabelValues("edge-b", "cluster_mismatch")) - before; got != 1 {
		t.Errorf("cluster_mismatch rejections: %v, want 1", got)
	}
}

func TestPeersLocalityAny(t *testing.T) {
	withClient(t, byKubeconfig(map[string]kubernetes.Interface{
		"/edge-a": fake.NewClientset(exporter("a1", "10.0.0.1", backendAnno)),
		"/edge-b": fake.NewClientset(exporter("b1", "10.1.0.1", backendAnno)),
	}))
	i, udp, _, err := coretest.CoreDNSServerAndPorts(peersCorefile("locality any"))
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)
	// edge-c is dead: it delays nothing.
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1", "10.1.0.1"})
}

// A restart while a peer is unreachable serves its snapshot records until
// the peer has been out of contact for longer than expire, then drops them;
// the local cluster, still answering, keeps its records.
func TestPeerExpiresAfterOfflineRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	clients := map[string]kubernetes.Interface{
		"/edge-a": fake.NewClientset(exporter("a1", "10.0.0.1", backendAnno)),
		"/edge-b": fake.NewClientset(exporter("db1", "10.1.0.5", `{"services":[{"name":"db"}]}`)),
		"/edge-c": fake.NewClientset(),
	}
	withClient(t, byKubeconfig(clients))
	corefile := peersCorefile("snapshot " + path + "\n        expire 1s")
	i, udp, _, err := coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, udp, "db.default.svc.clusterset.local.", []string{"10.1.0.5"})
	m := liveInstance(t)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !(m.sources[1].HasSynced() && m.sources[0].HasSynced()); {
		time.Sleep(10 * time.Millisecond)
	}
	stopServer(i)

	delete(clients, "/edge-b") // edge-b is now unreachable
	before := testutil.ToFloat64(sourceExpirations.WithLabelValues("edge-b"))
	i, udp, _, err = coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)
	if got := addrsOf(exchange(t, "udp", udp, "db.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.1.0.5"}) {
		t.Fatalf("right after the restart, edge-b's snapshot records must answer: %v", got)
	}
	var r *dns.Msg
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r = exchange(t, "udp", udp, "db.default.svc.clusterset.local.", dns.TypeA, 0); r.Rcode == dns.RcodeNameError {
			break
		}
	}
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("edge-b's records did not expire: %v", r)
	}
	if got := testutil.ToFloat64(sourceExpirations.WithLabelValues("edge-b")) - before; got != 1 {
		t.Errorf("expirations of edge-b: %v, want 1", got)
	}
	if got := addrsOf(exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("local records lost: %v", got)
	}
}
