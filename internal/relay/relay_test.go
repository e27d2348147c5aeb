package relay

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

const backend = `{"services":[{"name":"backend","ports":[{"name":"http","port":80}]}]}`

func genKey(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// stmt is one origin Pod's signed statement, as its annotator writes it.
type stmt struct {
	origin, ns, name string
	ip               string
	ready            bool
	seq              uint64
	export           string
	uid              string // "": "uid-" and the name
}

// pod returns the relay entry of s, signed with key (nil: unsigned).
func (s stmt) pod(key ed25519.PrivateKey) Pod {
	if s.export == "" {
		s.export = backend
	}
	ep := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{s.ip}, Ready: s.ready, Seq: s.seq})
	if s.uid == "" {
		s.uid = "uid-" + s.name
	}
	p := Pod{Name: s.name, UID: s.uid, Endpoint: ep}
	if key != nil {
		p.Signature = annotation.SignEndpoint(key, s.origin, s.ns, s.name, p.UID, s.export, ep)
	}
	return p
}

// slice returns the EndpointSlice a hub writes for origin in ns, relaying
// pods (whose Export indexes exports).
func slice(ns, name, origin string, exports []string, pods ...Pod) *discoveryv1.EndpointSlice {
	if exports == nil {
		exports = []string{backend}
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{
				discoveryv1.LabelManagedBy:    clusterset.ManagedBy,
				mcsv1beta1.LabelSourceCluster: origin,
			},
			Annotations: map[string]string{SliceAnnotation: Format(Slice{Exports: exports, Pods: pods})},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
}

func lease(ns, origin string, state source.State, renew time.Time) *coordinationv1.Lease {
	rt := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeasePrefix + origin,
			Labels:      map[string]string{OriginLabel: origin},
			Annotations: map[string]string{OriginStateAnnotation: state.String()}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &rt},
	}
}

// refusals records Events.Refused.
type refusals struct {
	mu  sync.Mutex
	got []string // "hub origin ns/pod reason"
}

func (r *refusals) events() Events {
	return Events{Refused: func(hub, origin, namespace, pod string, rej annotation.Rejection) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got = append(r.got, fmt.Sprintf("%s %s %s/%s %s", hub, origin, namespace, pod, rej.Reason))
	}}
}

func (r *refusals) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.got)
	sort.Strings(out)
	return out
}

// eventually polls cond until it holds, for at most 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

// records renders the store's records of cluster, sorted: "ns/name ip ready
// exports".
func records(st *store.Store, cluster string) []string {
	var out []string
	for _, p := range st.Pods(cluster) {
		var names []string
		for _, e := range p.Exports {
			names = append(names, e.Name)
		}
		out = append(out, fmt.Sprintf("%s/%s %v %v %v", p.Namespace, p.Name, p.IPs, p.Ready, names))
	}
	sort.Strings(out)
	return out
}

func rec(ns, name, ip string, ready bool, exports ...string) string {
	return fmt.Sprintf("%s/%s %v %v %v", ns, name, []netip.Addr{netip.MustParseAddr(ip)}, ready, exports)
}

// start starts a Relay over one fake hub per client, named hub-0, hub-1...,
// and waits until every hub that is up serves its watches.
func start(t *testing.T, st *store.Store, cfg Config, clients ...*fakeHub) *Relay {
	t.Helper()
	r := New(st, cfg)
	for i, c := range clients {
		if err := r.AddHub(fmt.Sprintf("hub-%d", i), c, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	for _, c := range clients {
		c.mu.Lock()
		gone := c.gone
		c.mu.Unlock()
		if !gone {
			eventually(t, "watches", c.watching)
		}
	}
	return r
}

func synced(r *Relay) bool {
	for _, h := range r.Hubs() {
		if !h.Synced {
			return false
		}
	}
	return true
}

// Each record a hub relays counts only when it is what its origin signed,
// for the slice's namespace and source-cluster; every other is refused once,
// with its reason, and the good records are unchanged.
func TestRelayVerifies(t *testing.T) {
	pubA, privA := genKey(t)
	pubB, privB := genKey(t)
	_, privX := genKey(t)
	good := stmt{origin: "origin-a", ns: "prod", name: "good", ip: "10.0.0.1", ready: true, seq: 5}
	goodRec := rec("prod", "good", "10.0.0.1", true, "backend")
	s := func(name string) stmt {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: "10.0.0.2", ready: true, seq: 7}
	}
	altered := func(name string, change func(*Pod, *[]string)) *discoveryv1.EndpointSlice {
		p := s(name).pod(privA)
		exports := []string{backend}
		change(&p, &exports)
		return slice("prod", "backend-"+name, "origin-a", exports, p)
	}
	cases := []struct {
		name   string
		keys   map[string]ed25519.PublicKey // nil: no verify
		slice  *discoveryv1.EndpointSlice
		want   []string // records of origin-a, besides good
		reason annotation.Reason
	}{
		{name: "signed", slice: slice("prod", "b", "origin-a", nil, s("p").pod(privA)),
			want: []string{rec("prod", "p", "10.0.0.2", true, "backend")}},
		{name: "unsigned", slice: slice("prod", "b", "origin-a", nil, s("p").pod(nil)), reason: annotation.ReasonUnsigned},
		{name: "forged with another key", slice: slice("prod", "b", "origin-a", nil, s("p").pod(privX)), reason: annotation.ReasonBadSignature},
		{name: "signed by another origin's key", slice: slice("prod", "b", "origin-a", nil, s("p").pod(privB)), reason: annotation.ReasonBadSignature},
		{name: "address changed", slice: altered("p", func(p *Pod, _ *[]string) {
			p.Endpoint = annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.9.9.9"}, Ready: true, Seq: 7})
		}), reason: annotation.ReasonBadSignature},
		{name: "ready flipped", slice: altered("p", func(p *Pod, _ *[]string) {
			p.Endpoint = annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.0.0.2"}, Ready: false, Seq: 7})
		}), reason: annotation.ReasonBadSignature},
		{name: "export changed", slice: altered("p", func(_ *Pod, e *[]string) {
			*e = []string{`{"services":[{"name":"admin"}]}`}
		}), reason: annotation.ReasonBadSignature},
		{name: "renamed", slice: altered("p", func(p *Pod, _ *[]string) { p.Name = "other" }), reason: annotation.ReasonBadSignature},
		{name: "moved to another namespace", slice: slice("staging", "b", "origin-a", nil, s("p").pod(privA)), reason: annotation.ReasonBadSignature},
		{name: "relabelled to another cluster", slice: slice("prod", "b", "origin-b", nil, s("p").pod(privA)), reason: annotation.ReasonBadSignature},
		{name: "origin without a key", slice: slice("prod", "b", "origin-c", nil, stmt{origin: "origin-c", ns: "prod", name: "p", ip: "10.0.0.3", seq: 1}.pod(privX)), reason: ReasonNoKey},
		{name: "malformed annotation", slice: func() *discoveryv1.EndpointSlice {
			es := slice("prod", "b", "origin-a", nil)
			es.Annotations[SliceAnnotation] = `{"pods":[{"name":"p","export":3}]}`
			return es
		}(), reason: ReasonMalformed},
		{name: "bad statement", slice: altered("p", func(p *Pod, _ *[]string) { p.Endpoint = `{"ips":["x"],"seq":1}` }), keys: map[string]ed25519.PublicKey{}, reason: ReasonMalformed},
		{name: "unsigned without verify", keys: map[string]ed25519.PublicKey{}, slice: slice("prod", "b", "origin-a", nil, s("p").pod(nil)),
			want: []string{rec("prod", "p", "10.0.0.2", true, "backend")}},
		{name: "export names another namespace without verify", keys: map[string]ed25519.PublicKey{},
			slice: slice("prod", "b", "origin-a", []string{`{"services":[{"name":"x","namespace":"kube-system"}]}`}, s("p").pod(nil)),
			want:  []string{rec("prod", "p", "10.0.0.2", true)}, reason: annotation.ReasonNamespaceOutside},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			keys := map[string]ed25519.PublicKey{"origin-a": pubA, "origin-b": pubB}
			if tc.keys != nil {
				keys = nil // the empty map of a case: no verify
			}
			var ref refusals
			st := store.New()
			r := start(t, st, Config{Local: "edge", Keys: keys, Events: ref.events()},
				newFakeHub(slice("prod", "backend-good", "origin-a", nil, good.pod(privA)), tc.slice))
			eventually(t, "synced", func() bool { return synced(r) })
			want := append([]string{goodRec}, tc.want...)
			sort.Strings(want)
			if got := records(st, "origin-a"); !slices.Equal(got, want) {
				t.Errorf("records: got %q, want %q", got, want)
			}
			for c, n := range st.Len() {
				if c != "origin-a" {
					t.Errorf("%d records of %s", n, c)
				}
			}
			got := ref.list()
			if tc.reason == "" {
				if len(got) > 0 {
					t.Errorf("refused %q", got)
				}
				return
			}
			if len(got) != 1 || !endsWith(got[0], string(tc.reason)) || !startsWith(got[0], "hub-0 ") {
				t.Errorf("refusals: got %q, want one %s", got, tc.reason)
			}
		})
	}
}

func endsWith(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}
func startsWith(s, prefix string) bool { return len(s) >= len(prefix) && s[:len(prefix)] == prefix }

// step is one change a hub makes in a replay scenario.
type step struct {
	hub    int
	slice  *discoveryv1.EndpointSlice // nil with del: delete
	del    string
	want   []string // origin-a's records after the step
	refuse []string // refusals so far
}

// Under verify, a statement older than one accepted for its Pod (or as old,
// with other bytes) is refused as replayed, across hubs and after the Pod's
// deletion; a hub that merely lags behind another is not reported.
func TestRelayReplays(t *testing.T) {
	pub, priv := genKey(t)
	at := func(seq uint64, ip string, ready bool) *discoveryv1.EndpointSlice {
		return slice("prod", "backend", "origin-a", nil, stmt{origin: "origin-a", ns: "prod", name: "p", ip: ip, ready: ready, seq: seq}.pod(priv))
	}
	r10 := rec("prod", "p", "10.0.0.10", true, "backend")
	r11 := rec("prod", "p", "10.0.0.11", false, "backend")
	replayed := "hub-0 origin-a prod/p replayed"
	replayed1 := "hub-1 origin-a prod/p replayed"
	cases := []struct {
		name  string
		steps []step
	}{
		{"older seq", []step{
			{slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{slice: at(5, "10.0.0.5", true), refuse: []string{replayed}},
		}},
		{"same seq, other bytes", []step{
			{slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{slice: at(10, "10.0.0.99", true), refuse: []string{replayed}},
		}},
		{"newer seq", []step{
			{slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{slice: at(11, "10.0.0.11", false), want: []string{r11}},
		}},
		{"old record after deletion", []step{
			{slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{del: "backend"},
			{slice: at(5, "10.0.0.5", true), refuse: []string{replayed}},
			{slice: at(11, "10.0.0.11", false), want: []string{r11}, refuse: []string{replayed}},
		}},
		{"another hub replays", []step{
			{slice: at(11, "10.0.0.11", false), want: []string{r11}},
			{hub: 1, slice: at(10, "10.0.0.10", true), want: []string{r11}, refuse: []string{replayed1}},
			{del: "backend", refuse: []string{replayed1}},
		}},
		{"the first hub lags", []step{
			{hub: 1, slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{hub: 1, slice: at(11, "10.0.0.11", false), want: []string{r11}},
			{slice: at(11, "10.0.0.11", false), want: []string{r11}},
		}},
		{"a lagging hub is superseded, not refused", []step{
			{hub: 1, slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{slice: at(10, "10.0.0.10", true), want: []string{r10}},
			{slice: at(11, "10.0.0.11", false), want: []string{r11}},
			{hub: 1, slice: at(11, "10.0.0.11", false), want: []string{r11}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ref refusals
			st := store.New()
			hubs := []*fakeHub{newFakeHub(), newFakeHub()}
			r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, Events: ref.events()}, hubs...)
			eventually(t, "synced", func() bool { return synced(r) })
			for i, s := range tc.steps {
				es := hubs[s.hub].DiscoveryV1().EndpointSlices("prod")
				var err error
				switch {
				case s.del != "":
					err = es.Delete(t.Context(), s.del, metav1.DeleteOptions{})
				default:
					if _, err = es.Update(t.Context(), s.slice, metav1.UpdateOptions{}); err != nil {
						_, err = es.Create(t.Context(), s.slice, metav1.CreateOptions{})
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				want := s.want
				// A written slice is applied before the next step: its hub
				// holds the origin (else, when the records wanted were
				// there already, a hub's older statement could arrive
				// after the next step's newer one, and be refused).
				holds := func() bool {
					if s.del != "" {
						return true
					}
					o, ok := r.Origin("origin-a")
					return ok && slices.Contains(o.Hubs, fmt.Sprintf("hub-%d", s.hub))
				}
				eventually(t, fmt.Sprintf("step %d: records %q and refusals %q", i, want, s.refuse), func() bool {
					return holds() && slices.Equal(records(st, "origin-a"), want) && slices.Equal(ref.list(), s.refuse)
				})
			}
		})
	}
}

// A record held by several hubs is one record; it goes when no synced hub
// holds it; a hub that stops answering loses nothing.
func TestRelayUnion(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	p := func(name, ip string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: 1}.pod(priv)
	}
	both := slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1"), p("b", "10.0.0.2"))
	onlyA := slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1"))
	ra, rb := rec("prod", "a", "10.0.0.1", true, "backend"), rec("prod", "b", "10.0.0.2", true, "backend")

	h0, h1 := newFakeHub(both), newFakeHub(onlyA)
	st := store.New()
	r := start(t, st, Config{Keys: keys}, h0, h1)
	eventually(t, "the union", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra, rb}) })
	if n := len(st.Pods("origin-a")); n != 2 {
		t.Fatalf("%d records, want 2", n)
	}
	// b leaves hub-0, and hub-1 does not hold it: it goes.
	if _, err := h0.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), onlyA, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b gone", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra}) })
	// b comes back on hub-1 only.
	if _, err := h1.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), both, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b back", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra, rb}) })
	// hub-1 stops answering: what it holds stays.
	h1.down(true)
	eventually(t, "hub-1 disconnected", func() bool { return r.Hubs()[1].State == source.Disconnected })
	if got := records(st, "origin-a"); !slices.Equal(got, []string{ra, rb}) {
		t.Errorf("after hub-1 went: %q", got)
	}
}

// fakeHub is a hub's API server: a fake clientset whose lists and watches
// fail while it is down (set by down, which also ends the watches it
// serves), and which counts the watches it serves: the fake serves a watch
// only the changes made after it started, so a test waits for them before
// it changes anything.
type fakeHub struct {
	*fake.Clientset
	mu      sync.Mutex
	gone    bool
	watches []watch.Interface
}

func newFakeHub(objs ...runtime.Object) *fakeHub {
	h := &fakeHub{Clientset: fake.NewClientset(objs...)}
	h.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.gone {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	h.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.gone {
			return true, nil, errors.New("connection refused")
		}
		w, err := h.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err == nil {
			h.watches = append(h.watches, w)
		}
		return true, w, err
	})
	return h
}

// down makes the hub fail (or answer again).
func (h *fakeHub) down(gone bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = gone
	for _, w := range h.watches {
		w.Stop()
	}
	h.watches = nil
}

// watching reports whether the hub serves both watches of a reader.
func (h *fakeHub) watching() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watches) >= 2
}

// A refused entry is reported when it arrives, not again at each change of
// its slice's other entries; a new refusal in the slice is.
func TestRelayReportsOncePerChange(t *testing.T) {
	pub, priv := genKey(t)
	_, other := genKey(t)
	good := func(seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: "good", ip: "10.0.0.1", ready: true, seq: seq}.pod(priv)
	}
	bad := func(name string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: "10.0.0.2", seq: 1}.pod(other)
	}
	h := newFakeHub(slice("prod", "backend", "origin-a", nil, good(1), bad("bad")))
	var ref refusals
	st := store.New()
	start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, Events: ref.events()}, h)
	first := []string{"hub-0 origin-a prod/bad bad_signature"}
	eventually(t, "the first refusal", func() bool { return slices.Equal(ref.list(), first) })
	es := h.DiscoveryV1().EndpointSlices("prod")
	for seq := uint64(2); seq <= 4; seq++ {
		if _, err := es.Update(t.Context(), slice("prod", "backend", "origin-a", nil, good(seq), bad("bad")), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := es.Update(t.Context(), slice("prod", "backend", "origin-a", nil, good(5), bad("bad"), bad("worse")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := append(slices.Clone(first), "hub-0 origin-a prod/worse bad_signature")
	eventually(t, "the second refusal alone", func() bool {
		return slices.Equal(ref.list(), second) && len(st.Pods("origin-a")) == 1 && st.Pods("origin-a")[0].Ready
	})
}

// While a hub is current on an origin (in contact, its Lease saying
// connected), the union is the current hubs': a Pod the origin deleted while
// another hub was cut off goes, though that hub still holds it.
func TestRelayCurrentHubs(t *testing.T) {
	pub, priv := genKey(t)
	p := func(name, ip string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: 1}.pod(priv)
	}
	both := slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1"), p("b", "10.0.0.2"))
	ra, rb := rec("prod", "a", "10.0.0.1", true, "backend"), rec("prod", "b", "10.0.0.2", true, "backend")
	connected := beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, time.Now())
	h0, h1 := newFakeHub(both, connected), newFakeHub(both, connected)
	st := store.New()
	r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h0, h1)
	eventually(t, "both records, origin connected", func() bool {
		o := r.Origins()
		return slices.Equal(records(st, "origin-a"), []string{ra, rb}) && len(o) == 1 && o[0].State == source.Connected
	})
	h1.down(true)
	eventually(t, "hub-1 disconnected", func() bool { return r.Hubs()[1].State == source.Disconnected })
	if got := records(st, "origin-a"); !slices.Equal(got, []string{ra, rb}) {
		t.Fatalf("after hub-1 went: %q", got)
	}
	if _, err := h0.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b gone through the current hub", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra}) })
}

// A hub that lags (it went down while a Pod was not ready) and one that
// holds the newer statement beside a replay of the older one: once neither
// is current, the union still takes the newest statement, never the older.
func TestRelayLaggingHubAndReplayWhenNoneCurrent(t *testing.T) {
	pub, priv := genKey(t)
	s := func(ready bool, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: "a", ip: "10.0.0.1", ready: ready, seq: seq}.pod(priv)
	}
	b := stmt{origin: "origin-a", ns: "prod", name: "b", ip: "10.0.0.2", ready: true, seq: 1}.pod(priv)
	connected := beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, time.Now())
	h0 := newFakeHub(slice("prod", "backend", "origin-a", nil, s(false, 2), b), connected)
	h1 := newFakeHub(slice("prod", "backend", "origin-a", nil, s(false, 2), b), connected)
	st := store.New()
	r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h0, h1)
	notReady, ready := rec("prod", "a", "10.0.0.1", false, "backend"), rec("prod", "a", "10.0.0.1", true, "backend")
	rb := rec("prod", "b", "10.0.0.2", true, "backend")
	eventually(t, "a not ready", func() bool { return slices.Equal(records(st, "origin-a"), []string{notReady, rb}) })
	h0.down(true)
	eventually(t, "hub-0 disconnected", func() bool { return r.Hubs()[0].State == source.Disconnected })
	if _, err := h1.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), slice("prod", "backend", "origin-a", nil, s(true, 3), b), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a ready through hub-1", func() bool { return slices.Equal(records(st, "origin-a"), []string{ready, rb}) })
	if _, err := h1.DiscoveryV1().EndpointSlices("prod").Create(t.Context(), slice("prod", "backend-replayed", "origin-a", nil, s(false, 2)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := records(st, "origin-a"); !slices.Equal(got, []string{ready, rb}) {
		t.Fatalf("after hub-1 replayed the older statement: %q", got)
	}
	h1.down(true)
	eventually(t, "hub-1 disconnected", func() bool { return r.Hubs()[1].State == source.Disconnected })
	time.Sleep(200 * time.Millisecond)
	if got := records(st, "origin-a"); !slices.Equal(got, []string{ready, rb}) {
		t.Fatalf("with neither hub current: %q, want a's newest statement (ready)", got)
	}
}

// A current hub that lags (it holds an older statement of a Pod than the one
// accepted) does not take the Pod back to it, nor drop it, when the hub that
// held the newer statement goes: the newest statement stays.
func TestRelayCurrentHubLags(t *testing.T) {
	pub, priv := genKey(t)
	s := func(ready bool, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: "a", ip: "10.0.0.1", ready: ready, seq: seq}.pod(priv)
	}
	connected := beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, time.Now())
	h0 := newFakeHub(slice("prod", "backend", "origin-a", nil, s(false, 2)), connected)
	h1 := newFakeHub(slice("prod", "backend", "origin-a", nil, s(true, 3)), connected)
	st := store.New()
	r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h0, h1)
	ready := rec("prod", "a", "10.0.0.1", true, "backend")
	eventually(t, "a ready (the newer statement)", func() bool { return slices.Equal(records(st, "origin-a"), []string{ready}) })
	h1.down(true)
	eventually(t, "hub-1 disconnected", func() bool { return r.Hubs()[1].State == source.Disconnected })
	time.Sleep(200 * time.Millisecond)
	if got := records(st, "origin-a"); !slices.Equal(got, []string{ready}) {
		t.Fatalf("with only the lagging hub current: %q, want a's newest statement (ready)", got)
	}
}
