package relay

import (
	"crypto/ed25519"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// A hub writes each record's path with itself last, the distinct paths
// once; a record that crossed MaxPath hubs is not relayed; Parse refuses a
// Pod naming a path the slice lacks.
func TestEncodePath(t *testing.T) {
	proof := func(path string) *store.Proof {
		return &store.Proof{UID: "u", Export: backend, Endpoint: `{"ips":["10.0.0.1"],"seq":1}`, Path: path}
	}
	long := JoinPath([]string{"h1", "h2", "h3", "h4"})
	s, skipped := EncodeVia([]*store.Pod{
		proofRec("a", true, proof(""), "10.0.0.1"),
		proofRec("b", true, proof("hub-0"), "10.0.0.2"),
		proofRec("c", true, proof(""), "10.0.0.3"),
		proofRec("d", true, proof(long), "10.0.0.4"),
	}, "hub-1")
	if skipped != 1 {
		t.Errorf("skipped %d, want 1 (d crossed MaxPath hubs)", skipped)
	}
	want := [][]string{{"hub-1"}, {"hub-0", "hub-1"}}
	if !slices.EqualFunc(s.Paths, want, slices.Equal) {
		t.Errorf("paths %q, want %q", s.Paths, want)
	}
	for i, w := range []string{"hub-1", "hub-0,hub-1", "hub-1"} {
		if got := JoinPath(s.PodPath(i)); got != w {
			t.Errorf("pod %s: path %q, want %q", s.Pods[i].Name, got, w)
		}
	}
	back, err := Parse(Format(s))
	if err != nil || Format(back) != Format(s) {
		t.Fatalf("parse: %v, %v", err, Format(back))
	}
	// Without a hub (or from an older hub): no paths.
	if s, _ := Encode([]*store.Pod{proofRec("a", true, proof(""), "10.0.0.1")}); s.Paths != nil || strings.Contains(Format(s), "path") {
		t.Errorf("a direct record's slice has a path: %s", Format(s))
	}
	for _, bad := range []string{
		`{"exports":["{}"],"pods":[{"name":"a","export":0,"endpoint":"{}","path":1}]}`,
		`{"exports":["{}"],"pods":[{"name":"a","export":0,"endpoint":"{}","path":1}],"paths":[["h"]]}`,
		`{"exports":["{}"],"pods":[{"name":"a","export":0,"endpoint":"{}","path":-1}],"paths":[["h"]]}`,
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%s) took it", bad)
		}
	}
}

// withPaths is slice with paths, pod i taking paths[i].
func withPaths(es *discoveryv1.EndpointSlice, pods []Pod, paths ...[]string) *discoveryv1.EndpointSlice {
	s := Slice{Exports: []string{backend}, Pods: pods, Paths: paths}
	for i := range s.Pods {
		s.Pods[i].Path = i
	}
	es.Annotations[SliceAnnotation] = Format(s)
	return es
}

// A reader refuses a record whose path names it (it relayed it itself) or
// more than MaxPath hubs, reporting relay_loop; the others count. With
// KeepProof each record carries the bytes it came with, which re-encode to
// the same slice; without, records carry none.
func TestRelayPathRules(t *testing.T) {
	pub, priv := genKey(t)
	p := func(name, ip string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: 3}.pod(priv)
	}
	// e's path is not the one it came by: the origin's signature, which
	// does not cover the path, still decides.
	pods := []Pod{p("a", "10.0.0.1"), p("b", "10.0.0.2"), p("c", "10.0.0.3"), p("d", "10.0.0.4"), p("e", "10.0.0.5")}
	es := withPaths(slice("prod", "backend", "origin-a", nil), pods,
		[]string{"hub-0"}, []string{"hub-0", "me", "hub-1"}, []string{"a", "b", "c", "d", "e"}, []string{"hub-0", "Bad!"}, []string{"made-up", "hub-0"})
	var ref refusals
	st := store.New()
	start(t, st, Config{Local: "me", KeepProof: true, Keys: map[string]ed25519.PublicKey{"origin-a": pub}, Events: ref.events()}, newFakeHub(es))
	eventually(t, "a and e", func() bool { return len(st.Pods("origin-a")) == 2 })
	want := []string{"hub-0 origin-a prod/b relay_loop", "hub-0 origin-a prod/c relay_loop", "hub-0 origin-a prod/d malformed_relay"}
	if got := ref.list(); !slices.Equal(got, want) {
		t.Errorf("refused %q, want %q", got, want)
	}
	// Kept proof: re-encoding the record gives the bytes that came.
	recs := st.Pods("origin-a")
	got, _ := Encode(recs)
	w := Slice{Exports: []string{backend}, Pods: []Pod{pods[0], pods[4]}, Paths: [][]string{{"hub-0"}, {"made-up", "hub-0"}}}
	w.Pods[1].Path = 1
	if Format(got) != Format(w) {
		t.Errorf("re-encoded\n%s\nwant\n%s", Format(got), Format(w))
	}
	// Without KeepProof: no proof, and the records share their Common.
	st2 := store.New()
	two := withPaths(slice("prod", "backend", "origin-a", nil), pods[:1], []string{"hub-0"})
	two = withPaths(two, []Pod{pods[0], p("e", "10.0.0.5")}, []string{"hub-0"}, []string{"hub-0"})
	start(t, st2, Config{Local: "me"}, newFakeHub(two))
	eventually(t, "a and e", func() bool { return len(st2.Pods("origin-a")) == 2 })
	r2 := st2.Pods("origin-a")
	if r2[0].Proof != nil || r2[0].Common != r2[1].Common {
		t.Errorf("an edge's records carry a proof or a Common each: %+v %+v", r2[0].Common, r2[1].Common)
	}
}

// Two hubs reading each other and hub h0, which reads the origin: once h0
// no longer holds a Pod, both drop it, and no hub ever holds a record whose
// path names itself. Each hub is a Relay that writes what it holds of the
// origin into its own slice (as its controller does), pumped in turns.
func TestHubsReadingEachOtherDropDeleted(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	p := func(name, ip string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: 1}.pod(priv)
	}
	h0 := newFakeHub(withPaths(slice("prod", "backend", "origin-a", nil), []Pod{p("a", "10.0.0.1"), p("b", "10.0.0.2")}, []string{"h0"}, []string{"h0"}))
	type hubT struct {
		name string
		own  *fakeHub
		st   *store.Store
	}
	hubs := []*hubT{{name: "ha", own: newFakeHub()}, {name: "hb", own: newFakeHub()}}
	for i, h := range hubs {
		h.st = store.New()
		r := New(h.st, Config{Local: h.name, KeepProof: true, Keys: keys})
		for j, c := range []*fakeHub{h0, hubs[1-i].own} {
			if err := r.AddHub([]string{"hub-0", "hub-1"}[j], c, ""); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop() })
	}
	eventually(t, "watches", func() bool { return hubs[0].own.watching() && hubs[1].own.watching() })
	// pump writes what each hub holds of the origin as its slice; it fails
	// the test if a hub holds a record naming it in its path.
	pump := func() {
		for _, h := range hubs {
			recs := h.st.Pods("origin-a")
			for _, r := range recs {
				if slices.Contains(SplitPath(r.Proof.Path), h.name) {
					t.Fatalf("%s holds %s through %s", h.name, r.Name, r.Proof.Path)
				}
			}
			v, _, _ := AnnotationVia(recs, h.name)
			es := slice("prod", "backend", "origin-a", nil)
			es.Annotations[SliceAnnotation] = v
			sl := h.own.DiscoveryV1().EndpointSlices("prod")
			if _, err := sl.Update(t.Context(), es, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
				_, err = sl.Create(t.Context(), es, metav1.CreateOptions{})
			}
		}
	}
	held := func(name string) bool {
		for _, h := range hubs {
			if !slices.ContainsFunc(h.st.Pods("origin-a"), func(r *store.Pod) bool { return r.Name == name }) {
				return false
			}
		}
		return true
	}
	gone := func(name string) bool {
		for _, h := range hubs {
			if slices.ContainsFunc(h.st.Pods("origin-a"), func(r *store.Pod) bool { return r.Name == name }) {
				return false
			}
		}
		return true
	}
	eventually(t, "both hubs hold a and b", func() bool { pump(); return held("a") && held("b") })
	for range 20 {
		pump() // let the paths through each other settle
	}
	// The origin deletes b: h0 drops it.
	if _, err := h0.DiscoveryV1().EndpointSlices("prod").Update(t.Context(),
		withPaths(slice("prod", "backend", "origin-a", nil), []Pod{p("a", "10.0.0.1")}, []string{"h0"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b gone from both hubs", func() bool { pump(); return gone("b") && held("a") })
	for range 50 {
		pump()
		if !gone("b") {
			t.Fatal("b came back")
		}
	}
}

// A hub's reader keeps, of each hub's origin Lease, the annotations under
// multicluster.mcsannotations.io/ but the state (a heartbeat, say), to copy
// them on; an edge's keeps none.
func TestOriginLeases(t *testing.T) {
	l := lease("kube-system", "origin-a", source.Connected, time.Now())
	l.Annotations["multicluster.mcsannotations.io/heartbeat"] = "beat"
	l.Annotations["example.com/other"] = "x"
	for _, keep := range []bool{true, false} {
		r := start(t, store.New(), Config{KeepProof: keep}, newFakeHub(l))
		eventually(t, "the Lease", func() bool { return len(r.Origins()) == 1 && r.Origins()[0].State == source.Connected })
		ols := r.OriginLeases()
		if len(ols) != 1 || !reflect.DeepEqual(ols[0].Origin, r.Origins()[0]) {
			t.Fatalf("keep %v: OriginLeases %+v, want origin-a as Origins gives it", keep, ols)
		}
		got := ols[0].Extra
		want := map[string]string{"multicluster.mcsannotations.io/heartbeat": "beat"}
		if !keep {
			want = nil
		}
		if !maps.Equal(got, want) {
			t.Errorf("keep %v: %v, want %v", keep, got, want)
		}
	}
}

// A hub's Lease of an origin counts only when its relay path is one the
// reader would take a record on: not naming the reader (hubs reading each
// other), at most MaxPath hubs, each a cluster ID. A Lease without a path
// (an older hub) counts.
func TestLeasePath(t *testing.T) {
	r := New(store.New(), Config{Local: "edge"})
	for _, tc := range []struct {
		path   string
		counts bool
	}{
		{"", true},
		{"hub-1", true},
		{"hub-1,hub-2", true},
		{JoinPath([]string{"h1", "h2", "h3", "h4"}), true},
		{"hub-1,edge", false},
		{"edge,hub-2", false},
		{JoinPath([]string{"h1", "h2", "h3", "h4", "h5"}), false},
		{"hub-1,,hub-2", false},
		{"Hub_1", false},
		{strings.Repeat(",", MaxPath*128+1), false},
	} {
		l := lease(DefaultNamespace, "origin-a", source.Connected, time.Now())
		if tc.path != "" {
			l.Annotations[LeasePathAnnotation] = tc.path
		}
		if got := r.toLease(l).origin == "origin-a"; got != tc.counts {
			t.Errorf("path %q: counts %v, want %v", tc.path, got, tc.counts)
		}
	}
}

// A hub's Lease refused for its relay path, other than a loop through the
// reader, is reported (Events.Refused, as a heartbeat's refusal) once per
// change of the refusal, not at each renewal; again once the hub wrote a
// Lease that counts in between. A path naming the reader (hubs reading
// each other) is not reported; nor, under verify, a Lease of an origin
// without a key.
func TestLeasePathRefusalReported(t *testing.T) {
	var rf refusals
	ls := func(origin, path string, renew time.Time) *coordinationv1.Lease {
		l := lease(DefaultNamespace, origin, source.Connected, renew)
		l.ResourceVersion = fmt.Sprint(renew.UnixNano())
		if path != "" {
			l.Annotations[LeasePathAnnotation] = path
		}
		return l
	}
	now := time.Now()
	tooLong := JoinPath([]string{"h1", "h2", "h3", "h4", "h5"})
	h := newFakeHub(ls("origin-a", tooLong, now), ls("origin-b", "hub-1,edge", now))
	r := start(t, store.New(), Config{Local: "edge", Events: rf.events()}, h)
	eventually(t, "hub listed", func() bool { return synced(r) })
	// rf.list() is sorted: so is want.
	want := []string{"hub-0 origin-a / relay_loop"}
	eventually(t, "origin-a's refusal reported", func() bool { return slices.Equal(rf.list(), want) })

	leases := h.CoordinationV1().Leases(DefaultNamespace)
	update := func(l *coordinationv1.Lease) {
		t.Helper()
		if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Renewals of the same refused Lease: nothing more.
	for i := range 3 {
		update(ls("origin-a", tooLong, now.Add(time.Duration(i+1)*time.Second)))
		update(ls("origin-b", "hub-1,edge", now.Add(time.Duration(i+1)*time.Second)))
	}
	// A malformed path is another refusal; a Lease that counts, then the
	// same malformed path again, reports it again.
	update(ls("origin-a", "hub-1,Not_An_ID", now.Add(5*time.Second)))
	want = []string{"hub-0 origin-a / malformed_relay", "hub-0 origin-a / relay_loop"}
	eventually(t, "the malformed path reported", func() bool { return slices.Equal(rf.list(), want) })
	update(ls("origin-a", "hub-1", now.Add(6*time.Second)))
	eventually(t, "origin-a's Lease taken", func() bool {
		o, ok := r.Origin("origin-a")
		return ok && o.State == source.Connected
	})
	update(ls("origin-a", "hub-1,Not_An_ID", now.Add(7*time.Second)))
	want = []string{"hub-0 origin-a / malformed_relay", "hub-0 origin-a / malformed_relay", "hub-0 origin-a / relay_loop"}
	eventually(t, "the malformed path reported again", func() bool { return slices.Equal(rf.list(), want) })
	time.Sleep(100 * time.Millisecond)
	if got := rf.list(); !slices.Equal(got, want) {
		t.Fatalf("refusals %v, want %v", got, want)
	}

	// Under verify, a Lease of an origin without a key is not reported.
	var rv refusals
	hv := newFakeHub(ls("origin-a", tooLong, now))
	keys := map[string]ed25519.PublicKey{"other": make(ed25519.PublicKey, ed25519.PublicKeySize)}
	rv2 := start(t, store.New(), Config{Local: "edge", Keys: keys, Events: rv.events()}, hv)
	eventually(t, "hub listed", func() bool { return synced(rv2) })
	time.Sleep(100 * time.Millisecond)
	if got := rv.list(); len(got) != 0 {
		t.Fatalf("under verify, refusals of a Lease of an origin without a key: %v", got)
	}
}
