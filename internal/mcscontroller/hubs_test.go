package mcscontroller

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// An edge's controller reading a hub: the hub is a controller with Relay
// (cluster "hub", reading origin b) writing into a fake clientset, which
// the edge's Relay reads; the edge never reads b.

const hubWebExport = `{"services":[{"name":"web","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`

// hubOf returns a relay hub holding n records of origin b in its slices and
// a Lease saying b is connected.
func hubOf(t *testing.T, n int) *env {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(nil)
	h := newEnv(t, Config{LocalCluster: "hub", Relay: true, RelayNamespace: relay.DefaultNamespace},
		[]*fakeSource{newSource("hub", true, time.Now()), newSource("b", true, time.Now())})
	for _, p := range relayed(n, key, func(int) string { return strings.Clone(hubWebExport) }) {
		h.table.Upsert(p)
	}
	h.start(false)
	h.waitSynced()
	if err := h.reconcile(); err != nil {
		t.Fatal(err)
	}
	hubLease(t, h, source.Connected, time.Now())
	return h
}

// hubLease writes the hub's Lease of b.
func hubLease(t *testing.T, h *env, st source.State, contact time.Time) {
	t.Helper()
	if err := h.ctl.applyLease(h.ctx, "b", leaseState{state: st.String(), contact: contact, path: h.ctl.cfg.LocalCluster}, nil); err != nil {
		t.Fatal(err)
	}
}

// edgeOf returns an edge's controller over local (and direct peers) reading
// hub as "hub-1", started, once the Relay listed it.
func edgeOf(t *testing.T, cfg Config, hub *env, sources ...*fakeSource) *env {
	t.Helper()
	e := newEdge(t, cfg, hub.client, sources)
	e.poll("the hub listed", func() bool {
		srcs, pending := e.ctl.relayed()
		return !pending && len(srcs) == 1 && srcs[0].HasSynced()
	})
	e.start(false)
	e.waitSynced()
	return e
}

// newEdge returns an edge's controller whose Relay reads hub as "hub-1",
// over the fakes holding objs; nothing of the controller runs yet.
func newEdge(t *testing.T, cfg Config, hub kubernetes.Interface, sources []*fakeSource, objs ...runtime.Object) *env {
	t.Helper()
	e := newEnv(t, cfg, sources, objs...)
	r := relay.New(e.table, relay.Config{Local: cfg.LocalCluster, Direct: e.ctl.direct, KeepProof: cfg.Relay})
	if err := r.AddHub("hub-1", hub, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	e.ctl.cfg.Hubs = r
	e.metrics.hubs.Store(r)
	return e
}

// After a restart with the hub out of reach (it never listed), the shares
// of relayed origins stay as the local API server holds them, until
// Expire counted from the start passes.
func TestHubPendingKeepsShares(t *testing.T) {
	hub := hubOf(t, 2)
	before := edgeOf(t, Config{LocalCluster: "edge"}, hub, newSource("edge", true, time.Now()))
	if err := before.reconcile(); err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, s := range before.slices() {
		objs = append(objs, s.DeepCopy())
	}
	for _, s := range before.derivedServices() {
		objs = append(objs, s.DeepCopy())
	}
	objs = append(objs, before.serviceImports()...)
	for _, c := range []struct {
		expire time.Duration
		kept   bool
	}{{0, true}, {time.Hour, true}, {time.Minute, false}} {
		t.Run(fmt.Sprint("expire=", c.expire), func(t *testing.T) {
			down := &atomic.Bool{}
			down.Store(true)
			cut := fake.NewSimpleClientset()
			unreachable(&cut.Fake, down)
			e := newEdge(t, Config{LocalCluster: "edge", Expire: c.expire}, cut, []*fakeSource{newSource("edge", true, time.Now())}, objs...)
			e.start(false)
			e.waitSynced()
			e.ctl.started = time.Now().Add(-10 * time.Minute)
			if _, pending := e.ctl.relayed(); !pending {
				t.Fatal("the hub listed while cut")
			}
			if err := e.reconcile(); err != nil {
				t.Fatal(err)
			}
			if got := len(e.slicesBy("web")["b"]); (got == 2) != c.kept || (e.serviceImport("web") != nil) != c.kept {
				t.Errorf("b's slices %v, import %v; want kept %v", e.slicesBy("web"), e.serviceImport("web") != nil, c.kept)
			}
		})
	}
}

// A relayed origin gets its ServiceImport and EndpointSlices as a peer
// does, with the addresses its hub relays.
func TestHubOriginImported(t *testing.T) {
	hub := hubOf(t, 3)
	e := edgeOf(t, Config{LocalCluster: "edge"}, hub, newSource("edge", true, time.Now()))
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	im := e.serviceImport("web")
	if im == nil || !slices.Equal(importClusters(im), []string{"b"}) {
		t.Fatalf("ServiceImport %v", im)
	}
	got := e.slicesBy("web")["b"]
	slices.Sort(got)
	if want := []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}; !slices.Equal(got, want) {
		t.Errorf("b's endpoints %v, want %v", got, want)
	}
	srcs, _ := e.ctl.allSources()
	if len(srcs) != 2 || srcs[1].Cluster() != "b" || !srcs[1].Connected() {
		t.Errorf("sources %v", srcs)
	}
}

// A relayed origin that its hub has not heard from for longer than Expire
// loses its share, as a peer does; before that it stays.
func TestHubOriginExpires(t *testing.T) {
	hub := hubOf(t, 2)
	e := edgeOf(t, Config{LocalCluster: "edge", Expire: time.Hour}, hub, newSource("edge", true, time.Now()))
	e.ctl.started = time.Now().Add(-3 * time.Hour)
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if len(e.slicesBy("web")["b"]) != 2 {
		t.Fatalf("connected: %v", e.slicesBy("web"))
	}
	for _, c := range []struct {
		last  time.Duration
		slice bool
	}{{30 * time.Minute, true}, {2 * time.Hour, false}} {
		hubLease(t, hub, source.Disconnected, time.Now().Add(-c.last))
		e.poll("the edge sees the Lease", func() bool {
			o := e.ctl.cfg.Hubs.Origins()
			return len(o) == 1 && o[0].State == source.Disconnected && time.Since(o[0].LastContact) > c.last-time.Minute
		})
		if err := e.reconcile(); err != nil {
			t.Fatal(err)
		}
		if got := len(e.slicesBy("web")["b"]) > 0; got != c.slice || (e.serviceImport("web") != nil) != c.slice {
			t.Errorf("out of contact %v: slices %v, import %v; want kept %v", c.last, e.slicesBy("web"), e.serviceImport("web") != nil, c.slice)
		}
	}
}

// An edge that is a hub itself relays what it reads through hubs too (its
// Relay keeps the proofs): its slices of relayed origin b carry the relay
// annotation with b's records' path, the hub then the edge; those of its
// direct peer c carry the edge alone.
func TestHubRelaysFurther(t *testing.T) {
	hub := hubOf(t, 2)
	cfg := Config{LocalCluster: "edge", Relay: true, RelayNamespace: relay.DefaultNamespace}
	edge := edgeOf(t, cfg, hub, newSource("edge", true, time.Now()), newSource("c", true, time.Now()))
	c := exporter("c", "web", "10.2.0.1", "Headless")
	c.Proof = &store.Proof{UID: "uid-c", Export: hubWebExport}
	edge.table.Upsert(c)
	if err := edge.reconcile(); err != nil {
		t.Fatal(err)
	}
	for _, s := range edge.slices() {
		cl := s.Labels[mcsv1beta1.LabelSourceCluster]
		sl, err := relay.Parse(s.Annotations[relay.SliceAnnotation])
		if err != nil || len(sl.Pods) == 0 {
			t.Fatalf("slice %s of %s: %v %+v", s.Name, cl, err, sl)
		}
		want := map[string]string{"b": "hub,edge", "c": "edge"}[cl]
		for i := range sl.Pods {
			if got := relay.JoinPath(sl.PodPath(i)); got != want {
				t.Errorf("slice %s of %s: path %q, want %q", s.Name, cl, got, want)
			}
		}
	}
	if got := edge.slicesBy("web"); len(got["b"]) != 2 || len(got["c"]) != 1 {
		t.Errorf("slices %v", got)
	}
}

// A hub of hubs deletes its Lease of a relayed origin once no hub it reads
// holds the origin any more (the hub below took it out: its Lease and
// slices went), and writes it again when the origin comes back.
func TestHubRelayedLeasePrune(t *testing.T) {
	hub := hubOf(t, 2)
	cfg := Config{LocalCluster: "edge", Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond, LeaseGrace: 50 * time.Millisecond}
	e := newEdge(t, cfg, hub.client, []*fakeSource{newSource("edge", true, time.Now())})
	e.start(true)
	exists := func(cluster string) bool {
		_, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+cluster, metav1.GetOptions{})
		return err == nil
	}
	e.poll("the Lease of relayed origin b", func() bool { return exists("b") && exists("edge") })
	l, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+"b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Annotations[relay.LeasePathAnnotation]; got != "hub,edge" {
		t.Errorf("the Lease of b: path %q, want hub,edge", got)
	}

	// The hub below takes b out.
	if err := hub.client.CoordinationV1().Leases(relay.DefaultNamespace).Delete(hub.ctx, relay.LeasePrefix+"b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range hub.slices() {
		if s.Labels[mcsv1beta1.LabelSourceCluster] == "b" {
			if err := hub.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(hub.ctx, s.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.poll("the Lease of b to go", func() bool { return !exists("b") })
	if !exists("edge") {
		t.Error("the Lease of the edge's own cluster went")
	}
	if n := testutil.ToFloat64(e.metrics.Writes.WithLabelValues("lease_delete", "ok")); n != 1 {
		t.Errorf("%v Lease deletes counted, want 1", n)
	}

	// b comes back through the hub: its Lease is written again.
	hubLease(t, hub, source.Connected, time.Now())
	e.poll("the Lease of b again", func() bool { return exists("b") })
}
