package mcsannotations

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	coretest "github.com/coredns/coredns/test"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/annotation"
)

func TestMain(m *testing.M) {
	d, err := InsertDirective(dnsserver.Directives)
	if err != nil {
		panic(err)
	}
	dnsserver.Directives = d
	os.Exit(m.Run())
}

const serverCorefile = `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge-a
        kubeconfig /unused-in-this-test
    }
}`

func exporter(name, ip, anno string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", ResourceVersion: "1",
			Labels:      map[string]string{annotation.ExporterLabel: "true"},
			Annotations: map[string]string{annotation.ExportAnnotation: anno}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: ip}},
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}

// stopServer stops a test server the way CoreDNS stops: listeners, then the
// shutdown callbacks (which stop the sources and close the snapshot).
func stopServer(i *caddy.Instance) {
	i.Stop()
	i.ShutdownCallbacks()
}

func withClient(t *testing.T, f func(string, string) (kubernetes.Interface, error)) {
	old := clientFor
	clientFor = f
	t.Cleanup(func() { clientFor = old })
}

func exchange(t *testing.T, network, addr, qname string, qtype uint16, bufsize uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(qname, qtype)
	if bufsize > 0 {
		m.SetEdns0(bufsize, false)
	}
	c := &dns.Client{Net: network, Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", network, qname, err)
	}
	return r
}

// A real CoreDNS server from a Corefile, fed by a fake clientset, queried
// over UDP and TCP.
func TestServerFromCorefile(t *testing.T) {
	objs := []runtime.Object{exporter("b1", "10.0.0.1", `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`),
		exporter("bad", "10.0.0.99", `{"services":[{"name":"backend","namespace":"kube-system"}]}`)}
	for i := range 60 {
		objs = append(objs, exporter(fmt.Sprintf("big-%d", i), fmt.Sprintf("10.0.1.%d", i+1), `{"services":[{"name":"big"}]}`))
	}
	client := fake.NewClientset(objs...)
	withClient(t, func(string, string) (kubernetes.Interface, error) { return client, nil })

	i, udp, tcp, err := coretest.CoreDNSServerAndPorts(serverCorefile)
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)

	deadline := time.Now().Add(5 * time.Second)
	var r *dns.Msg
	for time.Now().Before(deadline) {
		if r = exchange(t, "udp", udp, "big.default.svc.clusterset.local.", dns.TypeA, 4096); len(r.Answer) == 60 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(r.Answer) != 60 {
		t.Fatalf("big: %d answers after sync, want 60", len(r.Answer))
	}

	r = exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.0.0.1" {
		t.Fatalf("backend over UDP (the Pod claiming kube-system must not count): %v", r)
	}
	r = exchange(t, "tcp", tcp, "_http._tcp.backend.default.svc.clusterset.local.", dns.TypeSRV, 0)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.SRV).Port != 8080 || len(r.Extra) != 1 {
		t.Fatalf("SRV over TCP: %v", r)
	}
	// 60 A records do not fit 512 bytes: truncated over UDP, whole over TCP.
	r = exchange(t, "udp", udp, "big.default.svc.clusterset.local.", dns.TypeA, 0)
	if !r.Truncated || len(r.Answer) >= 60 {
		t.Fatalf("UDP without EDNS0: truncated=%v with %d answers", r.Truncated, len(r.Answer))
	}
	r = exchange(t, "tcp", tcp, "big.default.svc.clusterset.local.", dns.TypeA, 0)
	if r.Truncated || len(r.Answer) != 60 {
		t.Fatalf("TCP: truncated=%v with %d answers", r.Truncated, len(r.Answer))
	}
	r = exchange(t, "udp", udp, "nope.default.svc.clusterset.local.", dns.TypeA, 1232)
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || r.IsEdns0() == nil {
		t.Fatalf("NXDOMAIN with EDNS0: %v", r)
	}
}

// A dead API server and a hung one delay nothing: the server starts, answers
// what needs no data, and says NXDOMAIN (not SERVFAIL) for unknown names.
func TestServerStartsWithoutAPIServer(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0") // accepts connections, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	for name, host := range map[string]string{"dead": "https://127.0.0.1:1", "hung": "https://" + hung.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			withClient(t, func(string, string) (kubernetes.Interface, error) {
				return kubernetes.NewForConfig(&rest.Config{Host: host, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
			})
			start := time.Now()
			i, udp, _, err := coretest.CoreDNSServerAndPorts(serverCorefile)
			if err != nil {
				t.Fatal(err)
			}
			defer stopServer(i)
			r := exchange(t, "udp", udp, "dns-version.clusterset.local.", dns.TypeTXT, 0)
			if len(r.Answer) != 1 {
				t.Fatalf("dns-version: %v", r)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("first answer took %v", took)
			}
			r = exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
			if r.Rcode != dns.RcodeNameError {
				t.Fatalf("rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
			}
		})
	}
}
