package e2e

// The reader of relay hubs (internal/relay) against two real kube-apiservers
// standing in for hubs. The test writes what a hub's MCS controller would:
// EndpointSlices per (service, origin) carrying the origin Pods' signed
// statements (relay.SliceAnnotation) and one Lease per origin; a relay.Relay
// in the test process reads both hubs into a record store, under verify.
// Nothing here reads an origin: the records arrive through the hubs alone.

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const relayExport = `{"services":[{"name":"backend","ports":[{"name":"http","port":80}]}]}`

// relayStmt is an origin Pod's statement, signed as its annotator would.
type relayStmt struct {
	origin, ns, name, ip string
	ready                bool
	seq                  uint64
}

func (s relayStmt) pod(key ed25519.PrivateKey) relay.Pod {
	ep := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{s.ip}, Ready: s.ready, Seq: s.seq})
	uid := "uid-" + s.origin + "-" + s.name
	return relay.Pod{Name: s.name, UID: uid, Endpoint: ep,
		Signature: annotation.SignEndpoint(key, s.origin, s.ns, s.name, uid, relayExport, ep)}
}

func (s relayStmt) record() string {
	return fmt.Sprintf("%s %s/%s %s %v", s.origin, s.ns, s.name, s.ip, s.ready)
}

// relaySlice is the slice a hub writes for service backend of origin in ns.
func relaySlice(ns, name, origin string, pods ...relay.Pod) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{
				discoveryv1.LabelManagedBy:    clusterset.ManagedBy,
				mcsv1beta1.LabelSourceCluster: origin,
				mcsv1beta1.LabelServiceName:   "backend",
			},
			Annotations: map[string]string{relay.SliceAnnotation: relay.Format(relay.Slice{Exports: []string{relayExport}, Pods: pods})},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
}

func originLease(origin string, state source.State) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	holder := "hub"
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: relay.DefaultNamespace, Name: relay.LeasePrefix + origin,
			Labels:      map[string]string{relay.OriginLabel: origin},
			Annotations: map[string]string{relay.OriginStateAnnotation: state.String()}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now},
	}
}

// putSlice creates or replaces a slice on a hub.
func putSlice(t *testing.T, c *harness.Cluster, es *discoveryv1.EndpointSlice) {
	t.Helper()
	api := c.Client.DiscoveryV1().EndpointSlices(es.Namespace)
	cur, err := api.Get(t.Context(), es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(t.Context(), es, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(t.Context(), es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("%s: slice %s/%s: %v", c.Name, es.Namespace, es.Name, err)
	}
}

// waitRecords waits until the store's records are want.
func waitRecords(t *testing.T, st *store.Store, want []string) {
	t.Helper()
	harness.Eventually(t, propagation, func() error {
		if got := relayRecords(st); !slices.Equal(got, want) {
			return fmt.Errorf("records %q, want %q", got, want)
		}
		return nil
	})
}

// relayRecords renders the store's records of every cluster, sorted.
func relayRecords(st *store.Store) []string {
	var out []string
	for _, p := range st.Pods("") {
		ips := make([]string, len(p.IPs))
		for i, a := range p.IPs {
			ips[i] = a.String()
		}
		if len(p.Exports) != 1 || p.Exports[0].Name != "backend" {
			out = append(out, fmt.Sprintf("%s %s/%s: exports %v", p.Cluster, p.Namespace, p.Name, p.Exports))
			continue
		}
		out = append(out, fmt.Sprintf("%s %s/%s %s %v", p.Cluster, p.Namespace, p.Name, strings.Join(ips, ","), p.Ready))
	}
	sort.Strings(out)
	return out
}

// TestRelayReader: an edge reading two hubs gets every origin's records as
// one union; a hostile hub's forged, altered, moved, relabelled and replayed
// records are each refused, the good ones unchanged; a hub's API server
// killed loses none, and a Pod deleted meanwhile goes through the other hub
// (no stale answer from the one cut off).
func TestRelayReader(t *testing.T) {
	harness.RequireTools(t)
	hubs := harness.StartClusters(t, "hub-1", "hub-2")
	h1, h2 := hubs[0], hubs[1]
	keys := map[string]ed25519.PublicKey{}
	priv := map[string]ed25519.PrivateKey{}
	for _, o := range []string{"origin-a", "origin-b"} {
		priv[o], keys[o] = mustKey(t)
	}
	for _, c := range hubs {
		for _, ns := range []string{"prod", "staging"} {
			c.CreateNamespace(t, ns)
		}
	}
	a1 := relayStmt{"origin-a", "prod", "a1", "10.1.0.1", true, 100}
	a2 := relayStmt{"origin-a", "prod", "a2", "10.1.0.2", true, 100}
	b1 := relayStmt{"origin-b", "prod", "b1", "10.2.0.1", true, 100}
	b2 := relayStmt{"origin-b", "prod", "b2", "10.2.0.2", true, 100}
	p := func(s relayStmt) relay.Pod { return s.pod(priv[s.origin]) }
	// hub-1 holds a1, a2 and b1; hub-2 a1, b1 and b2: only the union has all.
	putSlice(t, h1, relaySlice("prod", "backend-a", "origin-a", p(a1), p(a2)))
	putSlice(t, h1, relaySlice("prod", "backend-b", "origin-b", p(b1)))
	putSlice(t, h2, relaySlice("prod", "backend-a", "origin-a", p(a1)))
	putSlice(t, h2, relaySlice("prod", "backend-b", "origin-b", p(b1), p(b2)))
	// The Pods each origin lists with its heartbeat (annotation.PodList).
	listed := map[string][]relayStmt{"origin-a": {a1, a2}, "origin-b": {b1, b2}}
	for _, c := range hubs {
		for _, o := range []string{"origin-a", "origin-b"} {
			// Under verify, "connected" counts with the origin's heartbeat,
			// written with its Pod list as the origin's annotator does.
			l := originLease(o, source.Connected)
			now := time.Now().UnixMilli()
			hb := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: o, Time: now})
			l.Annotations[relay.HeartbeatAnnotation] = hb
			l.Annotations[relay.HeartbeatSignatureAnnotation] = annotation.SignHeartbeat(priv[o], o, hb)
			var hashes []uint64
			for _, s := range listed[o] {
				hashes = append(hashes, annotation.PodHash(s.ns, s.name))
			}
			pl, ok := annotation.NewPodList(o, now, hashes)
			if !ok {
				t.Fatalf("no Pod list of %s", o)
			}
			list := annotation.FormatPodList(pl)
			l.Annotations[relay.PodListAnnotation] = list
			l.Annotations[relay.PodListSignatureAnnotation] = annotation.SignPodList(priv[o], o, list)
			if _, err := c.Client.CoordinationV1().Leases(relay.DefaultNamespace).Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}

	var mu sync.Mutex
	var refused []string
	st := store.New()
	r := relay.New(st, relay.Config{
		Local: "edge",
		Keys:  keys,
		Events: relay.Events{Refused: func(hub, origin, namespace, pod string, rej annotation.Rejection) {
			mu.Lock()
			defer mu.Unlock()
			refused = append(refused, fmt.Sprintf("%s %s %s/%s %s", hub, origin, namespace, pod, rej.Reason))
		}},
		Contact: source.Options{ProbeInterval: 500 * time.Millisecond},
	})
	reader := ingest.Reader{UserAgent: "relayreader-test"}
	for _, c := range hubs {
		client, err := reader.Pods(c.WatchConfig)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.AddHub(c.Name, client, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	refusals := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(refused)
		sort.Strings(out)
		return out
	}
	want := []string{a1.record(), a2.record(), b1.record(), b2.record()}
	sort.Strings(want)
	harness.Eventually(t, propagation, func() error {
		if got := relayRecords(st); !slices.Equal(got, want) {
			return fmt.Errorf("records %q, want %q", got, want)
		}
		return originsAre(r, source.Connected, "hub-1", "hub-2")
	})

	t.Run("hostile hub", func(t *testing.T) {
		forger, _ := mustKey(t)
		altered := p(a1)
		altered.Endpoint = annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.66.0.1"}, Ready: true, Seq: a1.seq})
		forged := relayStmt{"origin-a", "prod", "x", "10.66.0.2", true, 1}.pod(forger)
		older := a2
		older.ip, older.seq = "10.66.0.3", a2.seq-1
		putSlice(t, h2, relaySlice("prod", "backend-a", "origin-a", altered, forged, p(older)))
		putSlice(t, h2, relaySlice("staging", "backend-b", "origin-b", p(b1)))   // moved
		putSlice(t, h2, relaySlice("prod", "backend-b-as-a", "origin-a", p(b2))) // relabelled
		wantRefused := []string{
			"hub-2 origin-a prod/a1 " + string(annotation.ReasonBadSignature),
			"hub-2 origin-a prod/a2 " + string(relay.ReasonReplayed),
			"hub-2 origin-a prod/b2 " + string(annotation.ReasonBadSignature),
			"hub-2 origin-a prod/x " + string(annotation.ReasonBadSignature),
			"hub-2 origin-b staging/b1 " + string(annotation.ReasonBadSignature),
		}
		harness.Eventually(t, propagation, func() error {
			if got := refusals(); !slices.Equal(got, wantRefused) {
				return fmt.Errorf("refusals %q, want %q", got, wantRefused)
			}
			return nil
		})
		if got := relayRecords(st); !slices.Equal(got, want) {
			t.Errorf("records %q, want %q", got, want)
		}
	})

	t.Run("one hub killed", func(t *testing.T) {
		// hub-2 mends its ways and holds what hub-1 holds, and a change
		// of b2 that hub-1 has not seen yet.
		b2.ready, b2.seq = false, b2.seq+1
		putSlice(t, h2, relaySlice("prod", "backend-a", "origin-a", p(a1), p(a2)))
		putSlice(t, h2, relaySlice("prod", "backend-b", "origin-b", p(b1), p(b2)))
		for _, name := range []string{"staging/backend-b", "prod/backend-b-as-a"} {
			ns, n, _ := strings.Cut(name, "/")
			if err := h2.Client.DiscoveryV1().EndpointSlices(ns).Delete(t.Context(), n, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		want = []string{a1.record(), a2.record(), b1.record(), b2.record()}
		sort.Strings(want)
		waitRecords(t, st, want)
		h1.KillAPIServer(t, syscall.SIGKILL)
		harness.Eventually(t, propagation, func() error {
			for _, h := range r.Hubs() {
				if h.Name == "hub-1" && h.State != source.Disconnected {
					return fmt.Errorf("hub-1 %s", h.State)
				}
			}
			return nil
		})
		if got := relayRecords(st); !slices.Equal(got, want) {
			t.Errorf("records after hub-1 died %q, want %q", got, want)
		}
		// Both origins are still connected through hub-2.
		if err := originsAre(r, source.Connected, "hub-1", "hub-2"); err != nil {
			t.Error(err)
		}
		// origin-b deletes b1: it goes through the hub left, though hub-1,
		// cut off, still holds it; the other records stay.
		putSlice(t, h2, relaySlice("prod", "backend-b", "origin-b", p(b2)))
		want = []string{a1.record(), a2.record(), b2.record()}
		sort.Strings(want)
		waitRecords(t, st, want)
		// hub-2 says origin-a is lost: with hub-1 down, it is disconnected,
		// as of hub-2's renewTime.
		lost := originLease("origin-a", source.Disconnected)
		cur, err := h2.Client.CoordinationV1().Leases(relay.DefaultNamespace).Get(t.Context(), lost.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lost.ResourceVersion = cur.ResourceVersion
		if _, err := h2.Client.CoordinationV1().Leases(relay.DefaultNamespace).Update(t.Context(), lost, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, propagation, func() error {
			for _, o := range r.Origins() {
				if o.Cluster == "origin-a" && o.State != source.Disconnected {
					return fmt.Errorf("origin-a %s", o.State)
				}
			}
			return nil
		})
		if got := relayRecords(st); !slices.Equal(got, want) {
			t.Errorf("records after origin-a was lost %q, want %q", got, want)
		}
	})
}

func mustKey(t *testing.T) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	pub, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k, pub
}

// originsAre checks that every origin is in state, held by hubs.
func originsAre(r *relay.Relay, state source.State, hubs ...string) error {
	os := r.Origins()
	if len(os) != 2 {
		return fmt.Errorf("origins %+v", os)
	}
	for _, o := range os {
		if o.State != state || !slices.Equal(o.Hubs, hubs) {
			return fmt.Errorf("origin %s: %s through %q, want %s through %q", o.Cluster, o.State, o.Hubs, state, hubs)
		}
	}
	return nil
}
