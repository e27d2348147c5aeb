package relay

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Until every hub listed once, nothing is removed: records from a snapshot
// stay, and a hub that has not listed contributes nothing. Once all listed,
// the union is the truth.
func TestRelayWaitsForEveryHub(t *testing.T) {
	pub, priv := genKey(t)
	p := func(name, ip string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: 1}.pod(priv)
	}
	st := store.New()
	snap := func(name, ip string) *store.Pod {
		return &store.Pod{Common: &store.Common{Cluster: "origin-a", Namespace: "prod"}, Name: name, IPs: addrs(ip), Ready: true}
	}
	st.ReplaceCluster("origin-a", []*store.Pod{snap("a", "10.0.0.1"), snap("z", "10.0.0.26")})
	h0 := newFakeHub(slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1"), p("b", "10.0.0.2")))
	h1 := newFakeHub()
	h1.down(true)
	r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h0, h1)
	ra, rb := rec("prod", "a", "10.0.0.1", true, "backend"), rec("prod", "b", "10.0.0.2", true, "backend")
	rz := "prod/z [10.0.0.26] true []"
	eventually(t, "hub-0's records with the snapshot's", func() bool {
		return slices.Equal(records(st, "origin-a"), []string{ra, rb, rz})
	})
	if _, err := h0.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), slice("prod", "backend", "origin-a", nil, p("b", "10.0.0.2")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hub-0's update", func() bool {
		return r.Origins()[0].Records == 3 && slices.Equal(records(st, "origin-a"), []string{ra, rb, rz})
	})
	if hs := r.Hubs(); !hs[0].Synced || hs[1].Synced {
		t.Fatalf("hubs: %+v", hs)
	}
	h1.down(false) // hub-1 answers, holding nothing of origin-a
	eventually(t, "the union alone", func() bool { return slices.Equal(records(st, "origin-a"), []string{rb}) })
}

func addrs(ips ...string) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		out = append(out, netip.MustParseAddr(ip))
	}
	return out
}

// Relayed records of the reader's own cluster and of clusters it reads
// directly are ignored, silently; their records are left alone.
func TestRelayIgnoresLocalAndDirect(t *testing.T) {
	keys := map[string]ed25519.PublicKey{}
	privs := map[string]ed25519.PrivateKey{}
	for _, c := range []string{"edge", "direct-1", "origin-a"} {
		pub, priv := genKey(t)
		keys[c], privs[c] = pub, priv
	}
	h := newFakeHub()
	for _, c := range []string{"edge", "direct-1", "origin-a"} {
		es := slice("prod", "backend-"+c, c, nil, stmt{origin: c, ns: "prod", name: "relayed", ip: "10.0.0.9", ready: true, seq: 1}.pod(privs[c]))
		if _, err := h.DiscoveryV1().EndpointSlices("prod").Create(t.Context(), es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.CoordinationV1().Leases(DefaultNamespace).Create(t.Context(), listing(beating(lease(DefaultNamespace, c, source.Connected, time.Now()), privs[c], time.Now()), privs[c], time.Now(), "relayed"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st := store.New()
	own := func(c string) *store.Pod {
		return &store.Pod{Common: &store.Common{Cluster: c, Namespace: "prod"}, Name: "own", IPs: addrs("10.1.0.1")}
	}
	st.ReplaceCluster("edge", []*store.Pod{own("edge")})
	st.ReplaceCluster("direct-1", []*store.Pod{own("direct-1")})
	var ref refusals
	r := start(t, st, Config{Local: "edge", Direct: func(c string) bool { return c == "direct-1" }, Keys: keys, Events: ref.events()}, h)
	r.Seed("edge", time.Now())
	eventually(t, "origin-a", func() bool { return len(st.Pods("origin-a")) == 1 })
	for _, c := range []string{"edge", "direct-1"} {
		if got := records(st, c); !slices.Equal(got, []string{"prod/own [10.1.0.1] false []"}) {
			t.Errorf("%s: %q", c, got)
		}
	}
	if got := ref.list(); len(got) > 0 {
		t.Errorf("refused %q", got)
	}
	var names []string
	for _, o := range r.Origins() {
		names = append(names, o.Cluster)
	}
	if !slices.Equal(names, []string{"origin-a"}) {
		t.Errorf("origins %q", names)
	}
}

// An origin's state and last contact, from its Leases on each hub and each
// hub's own state.
func TestOriginView(t *testing.T) {
	t0 := time.Unix(1000, 0)
	t1, t2, t3 := t0.Add(time.Minute), t0.Add(2*time.Minute), t0.Add(3*time.Minute)
	type hubAt struct {
		state source.State
		last  time.Time
		lease *slimLease // nil: none
	}
	l := func(st source.State, renew time.Time) *slimLease {
		return &slimLease{origin: "o", state: st, renew: renew}
	}
	cases := []struct {
		name  string
		hubs  []hubAt
		seed  time.Time
		state source.State
		last  time.Time
		on    []string
	}{
		{"nothing known", nil, time.Time{}, source.Syncing, time.Time{}, nil},
		{"seeded only", nil, t1, source.Syncing, t1, nil},
		{"connected hub says connected", []hubAt{{source.Connected, t2, l(source.Connected, t0)}}, t1, source.Connected, t2, []string{"h0"}},
		{"disconnected hub says connected", []hubAt{{source.Disconnected, t2, l(source.Connected, t0)}}, t1, source.Disconnected, t2, []string{"h0"}},
		{"connected hub says disconnected", []hubAt{{source.Connected, t3, l(source.Disconnected, t1)}}, t0, source.Disconnected, t1, []string{"h0"}},
		{"a seed newer than the hubs", []hubAt{{source.Connected, t3, l(source.Disconnected, t1)}}, t2, source.Disconnected, t2, []string{"h0"}},
		{"one of two hubs connected says connected", []hubAt{
			{source.Connected, t3, l(source.Disconnected, t1)}, {source.Connected, t2, l(source.Connected, t0)},
		}, time.Time{}, source.Connected, t2, []string{"h0", "h1"}},
		{"the latest of two", []hubAt{
			{source.Connected, t3, l(source.Disconnected, t1)}, {source.Disconnected, t2, l(source.Connected, t0)},
		}, time.Time{}, source.Disconnected, t2, []string{"h0", "h1"}},
		{"syncing at its hub", []hubAt{{source.Connected, t3, l(source.Syncing, time.Time{})}}, time.Time{}, source.Syncing, time.Time{}, []string{"h0"}},
		{"connected on a hub not listed yet", []hubAt{{source.Syncing, t3, l(source.Connected, t0)}}, t1, source.Syncing, t3, []string{"h0"}},
		{"one hub without a Lease", []hubAt{{source.Connected, t3, nil}, {source.Connected, t2, l(source.Disconnected, t1)}}, time.Time{}, source.Disconnected, t1, []string{"h1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := New(store.New(), Config{})
			r.Seed("o", tc.seed)
			for i, ha := range tc.hubs {
				h := newHub(r, fmt.Sprintf("h%d", i), newFakeHub(), "")
				h.state.Store(int32(ha.state))
				h.lastContact.Store(ha.last.UnixNano())
				if ha.lease != nil {
					h.leases["o"] = ha.lease
				}
				r.hubs = append(r.hubs, h)
			}
			if tc.seed.IsZero() {
				r.origin("o")
			}
			got := r.Origins()
			want := []Origin{{Cluster: "o", Hubs: tc.on, State: tc.state, LastContact: tc.last}}
			if len(got) != 1 || got[0].State != tc.state || !got[0].LastContact.Equal(tc.last) || !slices.Equal(got[0].Hubs, tc.on) {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

// The Leases a hub writes drive the origin's state, reported at each
// change.
func TestOriginStateEvents(t *testing.T) {
	h := newFakeHub(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()))
	var mu sync.Mutex
	var got []string
	ev := Events{OriginState: func(o string, from, to source.State) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s→%s", o, from, to))
	}}
	r := start(t, store.New(), Config{Events: ev}, h)
	seen := func(want ...string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Equal(got, want)
		}
	}
	eventually(t, "connected", seen("origin-a syncing→connected"))
	renew := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	if _, err := h.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), lease(DefaultNamespace, "origin-a", source.Disconnected, renew), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "disconnected", seen("origin-a syncing→connected", "origin-a connected→disconnected"))
	if o := r.Origins(); len(o) != 1 || !o[0].LastContact.Equal(renew) || !slices.Equal(o[0].Hubs, []string{"hub-0"}) {
		t.Errorf("origins: %+v", o)
	}
}

// The slim form keeps the records and drops the slice (its endpoints, its
// annotation's statements and signatures): at most 200 B per record, the
// store's own cost per endpoint, and the record is the one the store holds.
func TestSlimSliceIsSmall(t *testing.T) {
	pub, priv := genKey(t)
	r := New(store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}})
	const nSlices, perSlice = 200, 50
	mk := func(i int) []any {
		var pods []Pod
		for j := range perSlice {
			pods = append(pods, stmt{origin: "origin-a", ns: "prod", name: fmt.Sprintf("pod-%d-%d", i, j), ip: fmt.Sprintf("10.%d.%d.1", i, j), ready: true, seq: 1}.pod(priv))
		}
		es := slice("prod", fmt.Sprintf("s-%d", i), "origin-a", nil, pods...)
		for j := range perSlice { // the endpoints, as the hub's controller writes them
			ready := true
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.1", i, j)},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready}})
		}
		return []any{es}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var full []any
	base := heap()
	for i := range nSlices {
		full = append(full, mk(i)...)
	}
	fullBytes := heap() - base
	var slim []*slimSlice
	base = heap()
	for _, es := range full {
		s := r.toSlim(es.(*discoveryv1.EndpointSlice))
		if len(s.entries) != perSlice || len(s.refusals()) > 0 {
			t.Fatalf("%d entries, refused %v", len(s.entries), s.refusals())
		}
		slim = append(slim, s)
	}
	slimBytes := heap() - base
	runtime.KeepAlive(full)
	runtime.KeepAlive(slim)
	per := slimBytes / (nSlices * perSlice)
	t.Logf("%d B per record slim, %d B per record as a slice", per, fullBytes/(nSlices*perSlice))
	if per > 200 || slimBytes*2 > fullBytes {
		t.Errorf("slim slices hold %d B per record, the slices %d B", per, fullBytes/(nSlices*perSlice))
	}
}

// A hub whose Leases may not be read still relays its records and stays
// connected; the refusal reaches the Ingest events.
func TestHubWithoutLeaseGrant(t *testing.T) {
	pub, priv := genKey(t)
	h := newFakeHub(slice("prod", "backend", "origin-a", nil, stmt{origin: "origin-a", ns: "prod", name: "p", ip: "10.0.0.1", ready: true, seq: 1}.pod(priv)))
	h.PrependReactor("list", "leases", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "", errors.New("no grant"))
	})
	var failures atomic.Int32
	st := store.New()
	r := New(st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub},
		Ingest: ingest.Options{Events: ingest.Events{Failed: func(err error) {
			if apierrors.IsForbidden(err) {
				failures.Add(1)
			}
		}}}})
	if err := r.AddHub("hub-0", h, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	eventually(t, "the record and two refused lists", func() bool { return len(st.Pods("origin-a")) == 1 && failures.Load() >= 2 })
	if hs := r.Hubs(); hs[0].State != source.Connected {
		t.Errorf("hub %+v", hs[0])
	}
}

// The replay memory is bounded per origin: tombstones go after
// TombstoneTTL, the oldest first when it is full; a new Pod that finds it
// full of live ones is refused, once.
func TestReplayMemoryBounded(t *testing.T) {
	now := time.Unix(10_000, 0)
	o := &origin{seen: map[string]*seen{
		"ns/live":  {seq: 1},
		"ns/old":   {seq: 1, gone: now.Add(-TombstoneTTL - time.Second)},
		"ns/young": {seq: 1, gone: now.Add(-time.Minute)},
		"ns/newer": {seq: 1, gone: now.Add(-time.Second)},
	}}
	o.prune(now)
	if _, ok := o.seen["ns/old"]; ok || len(o.seen) != 3 {
		t.Errorf("after prune: %v", o.seen)
	}
	defer func(n int) { ingest.MaxObjects = n }(ingest.MaxObjects)
	ingest.MaxObjects = 3
	if !o.admit("ns/new", now) {
		t.Fatal("full of tombstones: refused")
	}
	if _, ok := o.seen["ns/young"]; ok || len(o.seen) != 2 {
		t.Errorf("the oldest tombstone should go: %v", o.seen)
	}
	o.seen["ns/new"] = &seen{seq: 1}
	o.seen["ns/newer"].gone = time.Time{}
	if o.admit("ns/another", now) {
		t.Errorf("full of live Pods: admitted")
	}

	// Through a hub: two of three Pods fit, the third is refused once.
	pub, priv := genKey(t)
	var pods []Pod
	for i := range 3 {
		pods = append(pods, stmt{origin: "origin-a", ns: "prod", name: fmt.Sprintf("p%d", i), ip: fmt.Sprintf("10.0.0.%d", i+1), seq: 1}.pod(priv))
	}
	ingest.MaxObjects = 2
	var ref refusals
	st := store.New()
	start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, Events: ref.events()}, newFakeHub(slice("prod", "backend", "origin-a", nil, pods...)))
	eventually(t, "two records, one refusal", func() bool {
		got := ref.list()
		return len(st.Pods("origin-a")) == 2 && len(got) == 1 && endsWith(got[0], string(annotation.ReasonTooMany))
	})
}

// Without verify, an origin no hub holds any more, with no record and no
// snapshot, is forgotten: origins a hub churns do not pile up.
func TestChurnedOriginsForgotten(t *testing.T) {
	h := newFakeHub()
	st := store.New()
	r := start(t, st, Config{}, h)
	es := h.DiscoveryV1().EndpointSlices("prod")
	for i := range 5 {
		o := fmt.Sprintf("churn-%d", i)
		s := slice("prod", "backend", o, nil, stmt{origin: o, ns: "prod", name: "p", ip: "10.0.0.1", seq: 1}.pod(nil))
		if _, err := es.Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, o+" arrives", func() bool { return len(st.Pods(o)) == 1 })
		if err := es.Delete(t.Context(), "backend", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, o+" goes", func() bool { return len(st.Pods(o)) == 0 })
	}
	if o := r.Origins(); len(o) != 0 {
		t.Errorf("origins held: %+v", o)
	}
}

// An origin the snapshot named (Seed) that no hub holds once every hub
// listed is forgotten, its records gone: without verify, and under verify
// when it has no key (removed since). Under verify with a key it stays,
// disconnected with the snapshot's last contact (its replay memory is
// kept).
func TestSeededOriginForgotten(t *testing.T) {
	pub, priv := genKey(t)
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprint("verify=", verify), func(t *testing.T) {
			cfg := Config{}
			var key ed25519.PrivateKey
			if verify {
				cfg.Keys = map[string]ed25519.PublicKey{"held": pub, "keyed": pub}
				key = priv
			}
			st := store.New()
			seeded := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
			for _, o := range []string{"keyed", "keyless"} {
				st.ReplaceCluster(o, []*store.Pod{{Common: &store.Common{Cluster: o, Namespace: "prod"}, Name: "p", IPs: addrs("10.0.0.9"), Ready: true}})
			}
			h := newFakeHub(slice("prod", "backend", "held", nil, stmt{origin: "held", ns: "prod", name: "a", ip: "10.0.0.1", ready: true, seq: 1}.pod(key)))
			r := New(st, cfg)
			for _, o := range []string{"keyed", "keyless"} {
				r.Seed(o, seeded)
			}
			if err := r.AddHub("hub-0", h, ""); err != nil {
				t.Fatal(err)
			}
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Stop() })
			names := func() []string {
				var out []string
				for _, o := range r.Origins() {
					out = append(out, o.Cluster)
				}
				return out
			}
			want := []string{"held"}
			if verify {
				want = []string{"held", "keyed"}
			}
			eventually(t, fmt.Sprintf("origins %v", want), func() bool { return synced(r) && slices.Equal(names(), want) })
			if n := len(st.Pods("keyed")) + len(st.Pods("keyless")); n != 0 {
				t.Errorf("%d records of the seeded origins kept, want none", n)
			}
			if verify {
				if o := r.Origins()[1]; o.State != source.Disconnected || !o.LastContact.Equal(seeded) {
					t.Errorf("keyed: %+v, want disconnected with the snapshot's last contact %v", o, seeded)
				}
			}
		})
	}
}

// Under verify, a hub's Lease of an origin the reader has no key for is not
// taken: a hub writing Leases of made-up origins adds no origin (no memory,
// no series, no snapshot entry at the reader).
func TestLeaseOfUnknownOriginIgnored(t *testing.T) {
	pub, priv := genKey(t)
	h := newFakeHub(beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, time.Now()),
		lease(DefaultNamespace, "made-up-1", source.Connected, time.Now()),
		lease(DefaultNamespace, "made-up-2", source.Disconnected, time.Now()))
	r := start(t, store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h)
	eventually(t, "origin-a known", func() bool {
		o := r.Origins()
		return len(o) >= 1 && o[0].Cluster == "origin-a" && o[0].State == source.Connected
	})
	if o := r.Origins(); len(o) != 1 {
		t.Fatalf("origins %+v, want origin-a only", o)
	}
}

// Under verify, an origin the hub takes out (its Lease deleted, as a hub
// does for a cluster it no longer reads) is remembered with its replay
// memory, and reported disconnected, not syncing: every hub listed, and none
// holds it.
func TestOriginNoHubHoldsIsDisconnected(t *testing.T) {
	pub, priv := genKey(t)
	h := newFakeHub(beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, time.Now()))
	r := start(t, store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h)
	eventually(t, "origin-a connected", func() bool {
		o := r.Origins()
		return len(o) == 1 && o[0].State == source.Connected
	})
	if err := h.CoordinationV1().Leases(DefaultNamespace).Delete(t.Context(), LeasePrefix+"origin-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "origin-a held by no hub", func() bool {
		o := r.Origins()
		return len(o) == 1 && len(o[0].Hubs) == 0
	})
	if o := r.Origins()[0]; o.State != source.Disconnected || o.LastContact.IsZero() {
		t.Errorf("origin-a held by no hub: %+v, want disconnected with its last contact", o)
	}
}

// A Lease the hub deletes goes from the reader's view: the store hands the
// delete's own object, not the one it held, so the two are not the same
// pointer.
func TestDeletedLeaseGoes(t *testing.T) {
	r := New(store.New(), Config{})
	h := newHub(r, "h0", newFakeHub(), "")
	r.hubs = append(r.hubs, h)
	st := h.leaseStore()
	now := time.Now()
	if err := st.Add(r.toLease(lease(DefaultNamespace, "o", source.Connected, now))); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	held := h.leases["o"] != nil
	r.mu.Unlock()
	if !held {
		t.Fatal("the Lease added is not held")
	}
	if err := st.Delete(r.toLease(lease(DefaultNamespace, "o", source.Connected, now))); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := h.leases["o"]; l != nil {
		t.Errorf("the deleted Lease is still held: %+v", l)
	}
}
