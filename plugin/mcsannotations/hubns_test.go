package mcsannotations

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// oneHubEdge starts a CoreDNS (edge-a) reading one fake hub (hub-1) with
// the Corefile word extra, the hub holding lease and, for origin edge-o, a
// slice of backend in each of namespaces, whose Pod backend-N has address
// 10.7.0.N (N counting from 1); it returns the hub and the DNS address.
func oneHubEdge(t *testing.T, extra string, lease *coordinationv1.Lease, namespaces ...string) (*fake.Clientset, string) {
	t.Helper()
	originKey := writeKey(t, t.TempDir(), "edge-o")
	export := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`
	objs := []runtime.Object{lease}
	for n, ns := range namespaces {
		objs = append(objs, relaySliceObject(ns, "backend-edge-o-1", "edge-o", export,
			relayedPod(originKey, "edge-o", ns, fmt.Sprintf("backend-%d", n+1), fmt.Sprintf("10.7.0.%d", n+1), true, 1, export)))
	}
	hub := fake.NewClientset(objs...)
	clients := map[string]kubernetes.Interface{"/local": fake.NewClientset(), "/hub-1": hub}
	withClient(t, func(kubeconfig, _ string) (kubernetes.Interface, error) { return clients[kubeconfig], nil })
	i, udp, _, err := coretest.CoreDNSServerAndPorts(`clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge-a
        kubeconfig /local
        hub hub-1 /hub-1
        ` + extra + `
    }
}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(i) })
	return hub, udp
}

// With hub_namespaces, a CoreDNS reads only the hub's relay slices of the
// namespaces named: an origin's Service there is answered, one of another
// namespace that the hub holds too is not, and the hub is never asked for
// slices outside the namespaces named.
func TestHubNamespacesFromCorefile(t *testing.T) {
	hub, udp := oneHubEdge(t, "hub_namespaces default kube-public", originLease("hub-1", "edge-o", source.Connected, time.Now()), "default", "other")

	var r *dns.Msg
	for range 500 {
		r = exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 1232)
		if len(r.Answer) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.7.0.1" {
		t.Fatalf("backend.default: %v, want 10.7.0.1", r)
	}
	// The hub's lists came in (default's answer shows it): a slice of other
	// would be there now if it were read.
	if r := exchange(t, "udp", udp, "backend.other.svc.clusterset.local.", dns.TypeA, 1232); len(r.Answer) != 0 {
		t.Errorf("backend.other: %v, want no answer (not in hub_namespaces)", r.Answer)
	}
	asked := map[string]bool{}
	for _, a := range hub.Actions() {
		if a.GetResource().Resource != "endpointslices" {
			continue
		}
		if _, ok := a.(k8stesting.ListAction); ok {
			asked[a.GetNamespace()] = true
		}
	}
	if len(asked) != 2 || !asked["default"] || !asked["kube-public"] {
		t.Errorf("the hub's slices were listed in %v, want default and kube-public only", strings.Join(slices.Sorted(maps.Keys(asked)), ","))
	}
}

// expire applies to relayed origins: an origin whose hub has been out of
// contact with it for longer than the setting answers nothing, counted in
// source_expirations_total, until the hub is in contact with it again.
func TestHubOriginExpires(t *testing.T) {
	before := testutil.ToFloat64(sourceExpirations.WithLabelValues("edge-o"))
	hub, udp := oneHubEdge(t, "expire 200ms", originLease("hub-1", "edge-o", source.Disconnected, time.Now().Add(-time.Hour)), "default")

	const name = "backend.default.svc.clusterset.local."
	until := func(what string, cond func(*dns.Msg) bool) {
		t.Helper()
		var r *dns.Msg
		for range 500 {
			if r = exchange(t, "udp", udp, name, dns.TypeA, 1232); cond(r) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s never: last answer %v", what, r)
	}
	until("expired", func(*dns.Msg) bool { return testutil.ToFloat64(sourceExpirations.WithLabelValues("edge-o")) > before })
	until("no answer", func(r *dns.Msg) bool { return len(r.Answer) == 0 })
	if got := testutil.ToFloat64(sourceExpirations.WithLabelValues("edge-o")) - before; got != 1 {
		t.Errorf("source_expirations_total{edge-o} grew by %v, want 1", got)
	}

	l := originLease("hub-1", "edge-o", source.Connected, time.Now())
	l.ResourceVersion = "2"
	if _, err := hub.CoordinationV1().Leases(relay.DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("back", func(r *dns.Msg) bool { return len(r.Answer) == 1 && r.Answer[0].(*dns.A).A.String() == "10.7.0.1" })
}
