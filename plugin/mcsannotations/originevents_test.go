package mcsannotations

import (
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// A relayed origin's change of state reaches the table's stale policies as
// the relay writes it, not at the stale loop's next pass (the loop does not
// run here): the hub's Lease says it lost the origin ten minutes ago, and
// the service whose exporter drops a stale cluster's endpoints after 30 s
// answers nothing of it; the Lease says connected again, and it answers.
// Only an origin not connected is left for the loop.
func TestOriginStateReachesStalePolicy(t *testing.T) {
	const ns = "default"
	export := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}],"staleEndpoints":"Drop","staleGraceSeconds":30}]}`
	pod := relay.Pod{Name: "b1", UID: "uid-b1", Endpoint: annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.7.0.1"}, Ready: true, Seq: 1})}
	hub := fake.NewClientset(relaySliceObject(ns, "backend-edge-o-1", "edge-o", export, pod),
		originLease("hub-1", "edge-o", source.Connected, time.Now()))
	withClient(t, func(string, string) (kubernetes.Interface, error) { return hub, nil })

	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
	m := &MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}
	if err := m.newRelay(config{hubs: []peerConfig{{name: "hub-1", kubeconfig: "/hub-1"}}}, "edge-a"); err != nil {
		t.Fatal(err)
	}
	m.origins.started = time.Now().Add(-time.Hour)
	m.passOrigins(time.Now()) // the stale loop's first pass: no origin yet
	if err := m.relay.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.relay.Stop() })

	const name = "backend.default.svc.clusterset.local."
	answers := test.Case{Qname: name, Qtype: dns.TypeA, Answer: []dns.RR{test.A(name + " 5 IN A 10.7.0.1")}}
	dropped := test.Case{Qname: name, Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{test.SOA(soa)}}
	until := func(what string, tc test.Case) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			tb.Rebuild()
			err := test.SortAndCheck(serve(t, m, tc.Msg(), false), tc)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	update := func(state source.State, renew time.Time, version string) {
		t.Helper()
		l := originLease("hub-1", "edge-o", state, renew)
		l.ResourceVersion = version
		if _, err := hub.CoordinationV1().Leases(relay.DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	until("connected", answers)
	if m.origins.anyDown() {
		t.Error("an origin down while the hub says it is connected")
	}

	update(source.Disconnected, time.Now().Add(-10*time.Minute), "2")
	until("lost ten minutes ago", dropped)
	if !m.origins.anyDown() {
		t.Error("no origin down while the hub says it lost edge-o")
	}
	m.origins.mu.Lock()
	lagging := len(m.origins.lagging)
	m.origins.mu.Unlock()
	if lagging != 1 {
		t.Errorf("%d origins left to the stale loop, want 1 (edge-o)", lagging)
	}

	update(source.Connected, time.Now(), "3")
	until("connected again", answers)
	m.origins.mu.Lock()
	lagging = len(m.origins.lagging)
	m.origins.mu.Unlock()
	if lagging != 0 || m.origins.anyDown() {
		t.Errorf("%d origins left to the stale loop, want none: every origin is connected", lagging)
	}
}
