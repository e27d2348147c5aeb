package mcsannotations

import (
	"crypto/ed25519"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	coretest "github.com/coredns/coredns/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

const hubsCorefile = `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge-a
        kubeconfig /local
        hub hub-1 /hub-1
        hub hub-2 /hub-2
        verify {KEYS}
    }
}`

// relayedPod is one origin Pod as a hub relays it, signed with key.
func relayedPod(key ed25519.PrivateKey, origin, ns, name, ip string, ready bool, seq uint64, export string) relay.Pod {
	st := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{ip}, Ready: ready, Seq: seq})
	return relay.Pod{Name: name, UID: "uid-" + name, Endpoint: st, Signature: annotation.SignEndpoint(key, origin, ns, name, "uid-"+name, export, st)}
}

// relaySliceObject is an EndpointSlice as a hub's controller writes it for
// origin, carrying pods (each of export).
func relaySliceObject(ns, name, origin, export string, pods ...relay.Pod) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelManagedBy: clusterset.ManagedBy,
				mcsv1beta1.LabelServiceName: "backend", mcsv1beta1.LabelSourceCluster: origin},
			Annotations: map[string]string{relay.SliceAnnotation: relay.Format(relay.Slice{Exports: []string{export}, Pods: pods})}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
}

// originLease is a hub's Lease on origin: its state and last contact.
func originLease(hub, origin string, state source.State, renew time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: relay.LeasePrefix + origin, Namespace: relay.DefaultNamespace, ResourceVersion: "1",
			Labels:      map[string]string{relay.OriginLabel: origin},
			Annotations: map[string]string{relay.OriginStateAnnotation: state.String()}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(hub), RenewTime: &metav1.MicroTime{Time: renew}},
	}
}

// A CoreDNS reading two hubs (fake clientsets) answers an origin's records
// that its key signed, as one record when both hubs hold it; a hub's
// forged record answers nothing and is counted; the origin's state follows
// the hubs' Leases: while they say they lost it a minute ago, its answers
// carry EDE 3 naming it (after the start's grace), and not once one says
// it is connected again.
func TestHubsFromCorefile(t *testing.T) {
	keys := t.TempDir()
	writeKey(t, keys, "edge-a")
	originKey := writeKey(t, keys, "edge-o")
	forger := writeKey(t, t.TempDir(), "edge-o")
	const ns = "default"
	export := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`
	good := relayedPod(originKey, "edge-o", ns, "backend-1", "10.7.0.1", true, 10, export)
	lost := time.Now().Add(-time.Minute)
	hub1 := fake.NewClientset(relaySliceObject(ns, "backend-edge-o-1", "edge-o", export, good),
		withBeat(originLease("hub-1", "edge-o", source.Disconnected, lost), originKey, lost))
	evil := relayedPod(forger, "edge-o", ns, "evil", "10.66.0.66", true, 10, export)
	hub2 := fake.NewClientset(relaySliceObject(ns, "backend-edge-o-1", "edge-o", export, good, evil),
		withBeat(originLease("hub-2", "edge-o", source.Disconnected, lost), originKey, lost))
	clients := map[string]kubernetes.Interface{"/local": fake.NewClientset(), "/hub-1": hub1, "/hub-2": hub2}
	withClient(t, func(kubeconfig, _ string) (kubernetes.Interface, error) { return clients[kubeconfig], nil })
	refusedBefore := testutil.ToFloat64(relayRefused.WithLabelValues("hub-2", string(annotation.ReasonBadSignature)))

	i, udp, _, err := coretest.CoreDNSServerAndPorts(strings.ReplaceAll(hubsCorefile, "{KEYS}", keys))
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)

	const name = "backend.default.svc.clusterset.local."
	answer := func(want string, ede bool) *dns.Msg {
		t.Helper()
		deadline := time.Now().Add(3 * staleGrace)
		var r *dns.Msg
		for time.Now().Before(deadline) {
			r = exchange(t, "udp", udp, name, dns.TypeA, 1232)
			_, has := staleEDE(r)
			if len(r.Answer) == 1 && r.Answer[0].(*dns.A).A.String() == want && has == ede {
				return r
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s: %v, want only %s (EDE 3: %t)", name, r, want, ede)
		return nil
	}
	r := answer("10.7.0.1", true)
	if text, _ := staleEDE(r); !strings.HasPrefix(text, "stale: edge-o 1m") {
		t.Errorf("EDE text %q, want it to name edge-o, a minute out of contact", text)
	}
	if got := testutil.ToFloat64(relayRefused.WithLabelValues("hub-2", string(annotation.ReasonBadSignature))) - refusedBefore; got != 1 {
		t.Errorf("relay_refused_total{hub-2, bad_signature} grew by %v, want 1 (the forged record)", got)
	}

	// A relayed origin has no series per annotation rejection reason: its
	// refusals are counted by hub.
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "coredns_mcsannotations_rejected_annotations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cluster" && l.GetValue() == "edge-o" {
					t.Fatalf("a rejected_annotations_total series of the relayed origin: %v", m)
				}
			}
		}
	}

	// hub-2 is in contact with the origin again: no mark.
	l := withBeat(originLease("hub-2", "edge-o", source.Connected, time.Now()), originKey, time.Now())
	l.ResourceVersion = "2"
	if _, err := hub2.CoordinationV1().Leases(relay.DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	answer("10.7.0.1", false)
}

// staleEDE returns the EXTRA-TEXT of r's Extended DNS Error 3, if any.
func staleEDE(r *dns.Msg) (string, bool) {
	opt := r.IsEdns0()
	if opt == nil {
		return "", false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok && e.InfoCode == dns.ExtendedErrorCodeStaleAnswer {
			return e.ExtraText, true
		}
	}
	return "", false
}

// A relayed origin's records and its path are kept in the snapshot: a
// restart with both hubs unreachable answers them from the first query
// (they are not dropped as a cluster no longer configured), and the file
// names the hubs they came through.
func TestHubsSnapshotRestartOffline(t *testing.T) {
	keys := t.TempDir()
	writeKey(t, keys, "edge-a")
	originKey := writeKey(t, keys, "edge-o")
	snap := filepath.Join(t.TempDir(), "table.db")
	corefile := strings.ReplaceAll(hubsCorefile, "{KEYS}", keys)
	corefile = strings.Replace(corefile, "        verify", "        snapshot "+snap+"\n        verify", 1)
	export := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`
	pod := relayedPod(originKey, "edge-o", "default", "backend-1", "10.7.0.1", true, 10, export)
	hub := fake.NewClientset(relaySliceObject("default", "backend-edge-o-1", "edge-o", export, pod),
		withBeat(originLease("hub-1", "edge-o", source.Connected, time.Now()), originKey, time.Now()))
	clients := map[string]kubernetes.Interface{"/local": fake.NewClientset(), "/hub-1": hub, "/hub-2": fake.NewClientset()}
	withClient(t, func(kubeconfig, _ string) (kubernetes.Interface, error) { return clients[kubeconfig], nil })
	i, udp, _, err := coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.7.0.1"})
	waitSynced(t)
	// The origin's meta reaches the file at the next refresh.
	time.Sleep(2 * staleEvery)
	stopServer(i)

	withClient(t, deadAPI)
	logged := captureLog(t)
	i, udp, _, err = coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatal(err)
	}
	r := exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
	if got := addrsOf(r); !slices.Equal(got, []string{"10.7.0.1"}) {
		t.Fatalf("first answer after a restart with the hubs unreachable: %v", r)
	}
	stopServer(i)
	// The origins are summed up in one line, not one line each.
	if l := logged(); !strings.Contains(l, "snapshot: 1 origins through hubs: 1 records, last contacts from ") || strings.Contains(l, "snapshot: cluster edge-o") {
		t.Errorf("the restart's log does not sum the origins up in one line:\n%s", l)
	}

	if m := storedSources(t, snap)["edge-o"].Meta; !slices.Equal(m.Via, []string{"hub-1"}) || m.LastContact.IsZero() {
		t.Errorf("the origin's meta in the snapshot: %+v, want its last contact, via hub-1 (the hubs that last held it)", m)
	}
}

// An origin no hub holds any more is forgotten without verify, and leaves
// the snapshot, so that the file does not keep an entry per origin ever
// taken out and a restart does not seed it again: an origin the file named
// that no hub holds at the next start, and one whose slices and Lease a
// hub deletes while CoreDNS runs.
func TestForgottenOriginLeavesSnapshot(t *testing.T) {
	snap := filepath.Join(t.TempDir(), "table.db")
	corefile := `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge-a
        kubeconfig /local
        hub hub-1 /hub-1
        snapshot ` + snap + `
    }
}`
	const ns, qname, sliceName = "default", "backend.default.svc.clusterset.local.", "backend-edge-o-1"
	export := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`
	pod := relay.Pod{Name: "backend-1", UID: "uid-backend-1",
		Endpoint: annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.7.0.1"}, Ready: true, Seq: 1})}
	serve := func(hub kubernetes.Interface) (*caddy.Instance, string) {
		t.Helper()
		clients := map[string]kubernetes.Interface{"/local": fake.NewClientset(), "/hub-1": hub}
		withClient(t, func(kubeconfig, _ string) (kubernetes.Interface, error) { return clients[kubeconfig], nil })
		i, udp, _, err := coretest.CoreDNSServerAndPorts(corefile)
		if err != nil {
			t.Fatal(err)
		}
		return i, udp
	}
	// fileHolds reports whether the file (of the running CoreDNS, or not)
	// has an entry for edge-o.
	fileHolds := func() bool {
		_, ok := storedSources(t, snap)["edge-o"]
		return ok
	}
	waitFile := func(what string, want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); fileHolds() != want; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
		}
	}
	hubWith := func() *fake.Clientset {
		return fake.NewClientset(relaySliceObject(ns, sliceName, "edge-o", export, pod),
			originLease("hub-1", "edge-o", source.Connected, time.Now()))
	}

	// A first run writes edge-o to the file.
	i, udp := serve(hubWith())
	waitAnswer(t, udp, qname, []string{"10.7.0.1"})
	waitFile("edge-o written to the snapshot", true)
	stopServer(i)

	// The next start finds no hub holding it: forgotten once the hub
	// listed, and dropped from the file.
	hub := fake.NewClientset()
	i, udp = serve(hub)
	defer func() { stopServer(i) }()
	waitFile("edge-o, which no hub holds at the start, dropped from the snapshot", false)

	// The hub holds it again, then takes it out (its slice and Lease go)
	// after CoreDNS's first pass over the origins.
	if _, err := hub.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), relaySliceObject(ns, sliceName, "edge-o", export, pod), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hub.CoordinationV1().Leases(relay.DefaultNamespace).Create(t.Context(), originLease("hub-1", "edge-o", source.Connected, time.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, udp, qname, []string{"10.7.0.1"})
	waitFile("edge-o written to the snapshot again", true)
	m := liveInstance(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m.origins.mu.Lock()
		passed := !m.origins.pass.IsZero()
		m.origins.mu.Unlock()
		if passed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no pass over the origins within 10s")
		}
	}
	if err := hub.DiscoveryV1().EndpointSlices(ns).Delete(t.Context(), sliceName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := hub.CoordinationV1().Leases(relay.DefaultNamespace).Delete(t.Context(), relay.LeasePrefix+"edge-o", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, udp, qname, nil)
	waitFile("edge-o, taken out by its hub, dropped from the snapshot", false)
}
