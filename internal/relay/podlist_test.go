package relay

import (
	"crypto/ed25519"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// listing returns l carrying its origin's Pod list of at naming the Pods
// names of namespace prod, signed with key, as a hub copies it.
func listing(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time, names ...string) *coordinationv1.Lease {
	var hs []uint64
	for _, n := range names {
		hs = append(hs, annotation.PodHash("prod", n))
	}
	return carrying(l, key, at, hs)
}

// carrying returns l carrying its origin's Pod list of at of hashes hs,
// signed with key.
func carrying(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time, hs []uint64) *coordinationv1.Lease {
	return carry(l, key, at, hs, false)
}

// carry returns l carrying its origin's Pod list (by UID with uids) of at
// of hashes hs, signed with key.
func carry(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time, hs []uint64, uids bool) *coordinationv1.Lease {
	origin := l.Labels[OriginLabel]
	pl, _ := annotation.NewPodList(origin, at.UnixMilli(), hs)
	v := annotation.FormatPodList(pl)
	if uids {
		l.Annotations[PodUIDListAnnotation] = v
		l.Annotations[PodUIDListSignatureAnnotation] = annotation.SignPodUIDList(key, origin, v)
		return l
	}
	l.Annotations[PodListAnnotation] = v
	l.Annotations[PodListSignatureAnnotation] = annotation.SignPodList(key, origin, v)
	return l
}

// Under verify, a record whose statement is older than the origin's Pod list
// and whose Pod the list does not name is dropped, reported once; a record
// the list names, or whose statement is not older than the list, is kept;
// without a list that verifies nothing is dropped, and the Lease is reported
// once (no_pod_list). Without verify, lists are not read.
func TestPodListDropsUnlisted(t *testing.T) {
	pub, priv := genKey(t)
	_, other := genKey(t)
	now := time.Now().Truncate(time.Millisecond)
	at := uint64(now.UnixMilli())
	beat := func() *coordinationv1.Lease {
		return beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now)
	}
	p := func(name, ip string, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: seq}.pod(priv)
	}
	pods := slice("prod", "backend", "origin-a", nil,
		p("live", "10.0.0.1", at-5000),  // in the list
		p("gone", "10.0.0.2", at-5000),  // deleted before the list
		p("newer", "10.0.0.3", at),      // signed at the list's time
		p("later", "10.0.0.4", at+1000)) // signed after it
	live, gone := rec("prod", "live", "10.0.0.1", true, "backend"), rec("prod", "gone", "10.0.0.2", true, "backend")
	newer, later := rec("prod", "newer", "10.0.0.3", true, "backend"), rec("prod", "later", "10.0.0.4", true, "backend")
	all := []string{gone, later, live, newer}
	unsigned := listing(beat(), priv, now, "live")
	unsigned.Annotations[PodListSignatureAnnotation] = ""
	for _, tc := range []struct {
		name    string
		lease   *coordinationv1.Lease
		verify  bool
		want    []string
		refused []string
	}{
		{"list without the deleted Pod", listing(beat(), priv, now, "live"), true,
			[]string{later, live, newer}, []string{"hub-0 origin-a prod/gone unlisted"}},
		{"list naming every Pod", listing(beat(), priv, now, "live", "gone"), true, all, nil},
		{"list older than every statement", listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now.Add(-10*time.Second)), priv, now.Add(-10*time.Second), "live"), true, all, nil},
		{"no list", beat(), true, all, []string{"hub-0 origin-a / no_pod_list"}},
		{"unsigned list", unsigned, true, all, []string{"hub-0 origin-a / no_pod_list"}},
		{"list of another key", listing(beat(), other, now, "live"), true, all, []string{"hub-0 origin-a / no_pod_list"}},
		{"without verify", listing(beat(), priv, now, "live"), false, all, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keys map[string]ed25519.PublicKey
			if tc.verify {
				keys = map[string]ed25519.PublicKey{"origin-a": pub}
			}
			checkOneHub(t, keys, newFakeHub(pods, tc.lease), tc.want, tc.refused)
		})
	}
}

// checkOneHub reads hub with keys until origin-a is connected, and checks
// that its records come to be want, refused what is refused, and stay so.
func checkOneHub(t *testing.T, keys map[string]ed25519.PublicKey, hub *fakeHub, want, refused []string) {
	t.Helper()
	var ref refusals
	st := store.New()
	r := start(t, st, Config{Keys: keys, Events: ref.events()}, hub)
	eventually(t, "synced and connected", func() bool {
		o := r.Origins()
		return synced(r) && len(o) == 1 && o[0].State == source.Connected
	})
	eventually(t, "the records", func() bool { return slices.Equal(records(st, "origin-a"), want) })
	time.Sleep(50 * time.Millisecond) // more syncs: no more reports
	r.hubChanged()
	if got := ref.list(); !slices.Equal(got, refused) {
		t.Errorf("refused %q, want %q", got, refused)
	}
	if got := records(st, "origin-a"); !slices.Equal(got, want) {
		t.Errorf("records %q, want %q", got, want)
	}
}

// Two hubs: the honest one deletes a Pod and carries the origin's new list,
// the hostile one keeps the Pod's last ready statement and presents the
// origin's older heartbeat with the older list that named the Pod (recent
// enough to count): the Pod goes all the same, the newest list that
// verifies being the origin's word whichever hub carried it; a Pod created
// after the list stays. (A hostile hub that passes fresh heartbeats without
// their lists is not current at all: TestWithheldPodList.)
func TestPodListTwoHubs(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	s0 := uint64(t0.Add(-time.Minute).UnixMilli())
	p := func(name, ip string, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: seq}.pod(priv)
	}
	both := slice("prod", "backend", "origin-a", nil, p("live", "10.0.0.1", s0), p("gone", "10.0.0.2", s0))
	ra, rb := rec("prod", "live", "10.0.0.1", true, "backend"), rec("prod", "gone", "10.0.0.2", true, "backend")
	oldList := func() *coordinationv1.Lease {
		return listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, t0), priv, t0, "live", "gone")
	}
	for _, tc := range []struct {
		name    string
		hostile func() *coordinationv1.Lease // the hostile hub's Lease once the Pod is gone
	}{
		{"older heartbeat and list presented", oldList},
	} {
		t.Run(tc.name, func(t *testing.T) {
			honest, hostile := newFakeHub(both, oldList()), newFakeHub(both, oldList())
			var ref refusals
			st := store.New()
			r := start(t, st, Config{Keys: keys, Events: ref.events()}, honest, hostile)
			eventually(t, "both Pods", func() bool { return synced(r) && slices.Equal(records(st, "origin-a"), []string{rb, ra}) })

			// The origin deletes gone; then, at t1, writes a list without it
			// and creates a Pod after it. The honest hub follows; the
			// hostile one keeps gone, and relays the new Pod too.
			t1 := time.Now().Truncate(time.Millisecond)
			fresh := slice("prod", "backend", "origin-a", nil, p("live", "10.0.0.1", s0), p("new", "10.0.0.3", uint64(t1.UnixMilli())+1))
			kept := slice("prod", "backend", "origin-a", nil, p("live", "10.0.0.1", s0), p("gone", "10.0.0.2", s0), p("new", "10.0.0.3", uint64(t1.UnixMilli())+1))
			if _, err := hostile.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), tc.hostile(), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := hostile.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), kept, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			// Before the honest hub moves, the hostile one keeps gone in the
			// union: nothing proves it went.
			rn := rec("prod", "new", "10.0.0.3", true, "backend")
			eventually(t, "the new Pod", func() bool { return slices.Equal(records(st, "origin-a"), []string{rb, ra, rn}) })

			if _, err := honest.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), fresh, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			// Before the new list the hostile hub is current and holds
			// gone: the union keeps it.
			time.Sleep(50 * time.Millisecond)
			if got := records(st, "origin-a"); !slices.Equal(got, []string{rb, ra, rn}) {
				t.Fatalf("before the origin's new list: %q", got)
			}
			now := time.Now()
			l := listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, t1), priv, t1, "live")
			if _, err := honest.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "gone gone, through both hubs", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra, rn}) })
			o := r.Origins()
			if len(o) != 1 || o[0].State != source.Connected {
				t.Errorf("origin %+v, want connected", o)
			}
			time.Sleep(50 * time.Millisecond)
			got := ref.list()
			if !slices.Contains(got, "hub-1 origin-a prod/gone unlisted") || slices.Contains(got, "hub-0 origin-a prod/gone unlisted") {
				t.Errorf("refused %q, want gone unlisted on hub-1 only", got)
			}
		})
	}
}

// originState is the state of r's one origin (syncing until it has one).
func originState(r *Relay) source.State {
	if o := r.Origins(); len(o) == 1 {
		return o[0].State
	}
	return source.Syncing
}

// listingOver returns l carrying its origin's Pod list of at for an origin
// over annotation.MaxPodListPods: it names none.
func listingOver(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time) *coordinationv1.Lease {
	hs := make([]uint64, annotation.MaxPodListPods+1)
	for i := range hs {
		hs[i] = uint64(i)
	}
	return carrying(l, key, at, hs)
}

// Once a Pod list of an origin was seen, a hub that passes its fresh
// heartbeats without the list written with them (none, an older one, one
// that does not verify) is not current on the origin: it could otherwise
// keep a deleted Pod in the union by withholding the list that drops it.
// The origin stays connected through the honest hub; with the honest hub cut
// off it is disconnected (its records kept, as for hubs cut off), not
// connected through the hostile one; the hostile hub counts again once its
// Lease carries the list with the heartbeat.
func TestWithheldPodList(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	s0 := uint64(t0.Add(-time.Minute).UnixMilli())
	p := func(name, ip string, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: seq}.pod(priv)
	}
	live := slice("prod", "backend", "origin-a", nil, p("live", "10.0.0.1", s0))
	ra := rec("prod", "live", "10.0.0.1", true, "backend")
	listed := func(at time.Time) *coordinationv1.Lease {
		return listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, at), priv, at, "live", "kept")
	}
	fresh := func() *coordinationv1.Lease {
		return beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, time.Now())
	}
	_, other := genKey(t)
	for _, tc := range []struct {
		name    string
		hostile func() *coordinationv1.Lease
	}{
		{"no list", fresh},
		{"an older list", func() *coordinationv1.Lease { return listing(fresh(), priv, t0, "live", "kept") }},
		{"a list of another key", func() *coordinationv1.Lease { return listing(fresh(), other, time.Now(), "live", "kept") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			honest, hostile := newFakeHub(live, listed(t0)), newFakeHub(live, listed(t0))
			var ref refusals
			st := store.New()
			r := start(t, st, Config{Keys: keys, Events: ref.events()}, honest, hostile)
			eventually(t, "connected", func() bool {
				o := r.Origins()
				return synced(r) && len(o) == 1 && o[0].State == source.Connected && slices.Equal(records(st, "origin-a"), []string{ra})
			})

			// The hostile hub passes fresh heartbeats without their list,
			// and holds a Pod (signed by the origin, stated before the
			// list) the honest hub does not hold.
			if _, err := hostile.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), tc.hostile(), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the hostile hub's Lease refused", func() bool {
				return slices.Contains(ref.list(), "hub-1 origin-a / withheld_pod_list")
			})
			kept := slice("prod", "backend", "origin-a", nil, p("live", "10.0.0.1", s0), p("kept", "10.0.0.2", s0))
			if _, err := hostile.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), kept, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			if got := records(st, "origin-a"); !slices.Equal(got, []string{ra}) {
				t.Errorf("with the honest hub current: %q, want only what it holds", got)
			}

			// The honest hub is cut off from the origin: no hub is current,
			// the origin is disconnected, every record any hub holds is
			// kept.
			cut := listed(t0)
			cut.Annotations[OriginStateAnnotation] = source.Disconnected.String()
			if _, err := honest.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), cut, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			kr := rec("prod", "kept", "10.0.0.2", true, "backend")
			eventually(t, "disconnected, the records kept", func() bool {
				o := r.Origins()
				return len(o) == 1 && o[0].State == source.Disconnected && slices.Equal(records(st, "origin-a"), []string{kr, ra})
			})

			// The hostile hub carries the list with its heartbeat again:
			// current, the origin connected through it.
			if _, err := hostile.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), listed(time.Now()), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "connected through the hub again", func() bool {
				o := r.Origins()
				return len(o) == 1 && o[0].State == source.Connected
			})
			if got := ref.list(); slices.Contains(got, "hub-0 origin-a / withheld_pod_list") || slices.Contains(got, "hub-1 origin-a / no_pod_list") {
				t.Errorf("refused %q: the honest hub is not withholding, and a list was seen before the hostile hub's Lease lacked one", got)
			}
		})
	}
}

// Before any Pod list of an origin was seen, a Lease without one is taken
// as before lists (reported once, no_pod_list): older annotators and hubs
// write none. Once one was seen, a Lease without one is not taken
// (withheld_pod_list); a list of an origin over the cap counts as a list
// and drops nothing.
func TestPodListSeen(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	now := time.Now().Truncate(time.Millisecond)
	old := uint64(now.Add(-time.Hour).UnixMilli())
	p := stmt{origin: "origin-a", ns: "prod", name: "unnamed", ip: "10.0.0.1", ready: true, seq: old}.pod(priv)
	hub := newFakeHub(slice("prod", "backend", "origin-a", nil, p), beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now))
	ru := rec("prod", "unnamed", "10.0.0.1", true, "backend")
	var ref refusals
	st := store.New()
	r := start(t, st, Config{Keys: keys, Events: ref.events()}, hub)
	state := func() source.State { return originState(r) }
	update := func(l *coordinationv1.Lease) {
		t.Helper()
		if _, err := hub.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "connected without a list", func() bool {
		return synced(r) && state() == source.Connected && slices.Equal(records(st, "origin-a"), []string{ru})
	})
	if got := ref.list(); !slices.Equal(got, []string{"hub-0 origin-a / no_pod_list"}) {
		t.Errorf("before any list: refused %q", got)
	}

	// A list over the cap: a list all the same, naming none, dropping
	// nothing.
	t1 := now.Add(time.Millisecond)
	update(listingOver(beating(lease(DefaultNamespace, "origin-a", source.Connected, t1), priv, t1), priv, t1))
	time.Sleep(100 * time.Millisecond)
	if got := records(st, "origin-a"); state() != source.Connected || !slices.Equal(got, []string{ru}) {
		t.Errorf("with a list over the cap: %v, %q", state(), got)
	}

	// Without a list again: withheld.
	t2 := t1.Add(time.Millisecond)
	update(beating(lease(DefaultNamespace, "origin-a", source.Connected, t2), priv, t2))
	eventually(t, "disconnected, the record kept", func() bool {
		return state() == source.Disconnected && slices.Equal(records(st, "origin-a"), []string{ru})
	})
	// Its last contact is the list's, not the newer heartbeat's: what the
	// hub holds of it is not proven whole since.
	if o := r.Origins(); len(o) != 1 || !o[0].LastContact.Equal(t1) {
		t.Errorf("last contact %v, want the last list's %v (not the heartbeat's %v)", o, t1, t2)
	}
	want := []string{"hub-0 origin-a / no_pod_list", "hub-0 origin-a / withheld_pod_list"}
	if got := ref.list(); !slices.Equal(got, want) {
		t.Errorf("refused %q, want %q", got, want)
	}
}

// With RequirePodLists, a hub's Lease without a Pod list is withheld from
// the reader's first start (no list ever seen): the origin is not
// connected through it, its records kept as for a hub cut off, its last
// contact none through that Lease; no no_pod_list. A list as new as the
// heartbeat makes it connected.
func TestRequirePodLists(t *testing.T) {
	pub, priv := genKey(t)
	now := time.Now().Truncate(time.Millisecond)
	p := stmt{origin: "origin-a", ns: "prod", name: "web-0", ip: "10.0.0.1", ready: true, seq: 1}.pod(priv)
	hub := newFakeHub(slice("prod", "backend", "origin-a", nil, p), beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now))
	var ref refusals
	st := store.New()
	r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, RequirePodLists: true, Events: ref.events()}, hub)
	rw := rec("prod", "web-0", "10.0.0.1", true, "backend")
	origin := func() Origin {
		if o := r.Origins(); len(o) == 1 {
			return o[0]
		}
		return Origin{}
	}
	eventually(t, "disconnected without a list, the record kept", func() bool {
		return synced(r) && origin().State == source.Disconnected && slices.Equal(records(st, "origin-a"), []string{rw})
	})
	if o := origin(); !o.LastContact.IsZero() {
		t.Errorf("last contact %v through a Lease without the required list, want none", o.LastContact)
	}
	if got, want := ref.list(), []string{"hub-0 origin-a / withheld_pod_list"}; !slices.Equal(got, want) {
		t.Errorf("refused %q, want %q", got, want)
	}
	t1 := now.Add(time.Millisecond)
	if _, err := hub.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(),
		listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, t1), priv, t1), priv, t1, "web-0"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connected with the list", func() bool {
		o := origin()
		return o.State == source.Connected && o.LastContact.Equal(t1) && slices.Equal(records(st, "origin-a"), []string{rw})
	})
}

// listingUIDs returns l carrying its origin's Pod list by UID of at naming
// pods (name and UID) of namespace prod, signed with key.
func listingUIDs(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time, pods ...[2]string) *coordinationv1.Lease {
	var hs []uint64
	for _, p := range pods {
		hs = append(hs, annotation.PodUIDHash("prod", p[0], p[1]))
	}
	return carry(l, key, at, hs, true)
}

// A Pod deleted and made again under its name (a StatefulSet's), the hub
// holding only the old Pod's statement, older than the origin's lists:
// the list by name names the name, so the old statement is kept (what
// lists by name cannot tell); the list by UID names the new Pod's UID, so
// it is dropped (unlisted) whatever the list by name says. A statement of
// the old Pod signed after the list is kept (the list says nothing of it).
// A list by UID that does not verify leaves the list by name in force.
func TestPodUIDList(t *testing.T) {
	pub, priv := genKey(t)
	_, other := genKey(t)
	now := time.Now().Truncate(time.Millisecond)
	at := uint64(now.UnixMilli())
	beat := func() *coordinationv1.Lease {
		return beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now)
	}
	web := func(name, uid, ip string, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, uid: uid, ip: ip, ready: true, seq: seq}.pod(priv)
	}
	old := slice("prod", "backend", "origin-a", nil, web("web-0", "uid-old", "10.0.0.1", at-5000), web("web-1", "uid-1", "10.0.0.2", at-5000))
	later := slice("prod", "backend", "origin-a", nil, web("web-0", "uid-old", "10.0.0.1", at+1), web("web-1", "uid-1", "10.0.0.2", at-5000))
	r0, r1 := rec("prod", "web-0", "10.0.0.1", true, "backend"), rec("prod", "web-1", "10.0.0.2", true, "backend")
	made := [][2]string{{"web-0", "uid-new"}, {"web-1", "uid-1"}}
	for _, tc := range []struct {
		name    string
		slice   *discoveryv1.EndpointSlice
		lease   *coordinationv1.Lease
		want    []string
		refused []string
	}{
		{"by name only", old, listing(beat(), priv, now, "web-0", "web-1"), []string{r0, r1}, nil},
		{"by name and by UID", old, listingUIDs(listing(beat(), priv, now, "web-0", "web-1"), priv, now, made...),
			[]string{r1}, []string{"hub-0 origin-a prod/web-0 unlisted"}},
		{"by UID naming the old Pod", old, listingUIDs(listing(beat(), priv, now, "web-0", "web-1"), priv, now, [2]string{"web-0", "uid-old"}, made[1]),
			[]string{r0, r1}, nil},
		{"by UID, statement after it", later, listingUIDs(listing(beat(), priv, now, "web-0", "web-1"), priv, now, made...), []string{r0, r1}, nil},
		{"by UID of another key", old, listingUIDs(listing(beat(), priv, now, "web-0", "web-1"), other, now, made...), []string{r0, r1}, nil},
		{"by UID signed as by name", old, func() *coordinationv1.Lease {
			l := listingUIDs(listing(beat(), priv, now, "web-0", "web-1"), priv, now, made...)
			l.Annotations[PodUIDListSignatureAnnotation] = annotation.SignPodList(priv, "origin-a", l.Annotations[PodUIDListAnnotation])
			return l
		}(), []string{r0, r1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkOneHub(t, map[string]ed25519.PublicKey{"origin-a": pub}, newFakeHub(tc.slice, tc.lease), tc.want, tc.refused)
		})
	}
}

// Once a list by UID of an origin was seen, a hub's Lease that carries
// only the list by name (an older hub, or one that strips the list by UID
// to have an old statement kept) is taken as withholding lists: the origin
// is not current through it (withheld_pod_list), its records kept as for a
// hub cut off, and the list by name is not taken over the list by UID; the
// hub counts again once its Lease carries the list by UID.
func TestPodUIDListRequiredOnceSeen(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	s0 := uint64(t0.Add(-time.Minute).UnixMilli())
	web := func(name, uid, ip string) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, uid: uid, ip: ip, ready: true, seq: s0}.pod(priv)
	}
	honestSlice := slice("prod", "backend", "origin-a", nil, web("web-1", "uid-1", "10.0.0.2"))
	hostileSlice := slice("prod", "backend", "origin-a", nil, web("web-0", "uid-old", "10.0.0.1"), web("web-1", "uid-1", "10.0.0.2"))
	r1 := rec("prod", "web-1", "10.0.0.2", true, "backend")
	both := func(at time.Time) *coordinationv1.Lease {
		l := listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, at), priv, at, "web-0", "web-1")
		return listingUIDs(l, priv, at, [2]string{"web-0", "uid-new"}, [2]string{"web-1", "uid-1"})
	}
	byName := func(at time.Time) *coordinationv1.Lease {
		return listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, time.Now()), priv, at), priv, at, "web-0", "web-1")
	}
	honest, hostile := newFakeHub(honestSlice, both(t0)), newFakeHub(hostileSlice, both(t0))
	var ref refusals
	st := store.New()
	r := start(t, st, Config{Keys: keys, Events: ref.events()}, honest, hostile)
	state := func() source.State { return originState(r) }
	eventually(t, "connected, the old web-0 dropped", func() bool {
		return synced(r) && state() == source.Connected && slices.Equal(records(st, "origin-a"), []string{r1})
	})

	// The hostile hub strips the list by UID, with a newer heartbeat and
	// list by name: it is not current, and its list by name, newer, is
	// not taken: web-0's old statement stays dropped.
	t1 := t0.Add(time.Second)
	if _, err := hostile.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), byName(t1), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the hostile hub's Lease refused", func() bool {
		return slices.Contains(ref.list(), "hub-1 origin-a / withheld_pod_list")
	})
	time.Sleep(100 * time.Millisecond)
	if got := records(st, "origin-a"); state() != source.Connected || !slices.Equal(got, []string{r1}) {
		t.Errorf("with the list by UID stripped by one hub: %v, %q; want connected through the other, the old web-0 dropped", state(), got)
	}

	// The honest hub is cut off from the origin: no hub is current, every
	// record any hub holds is kept, but for what the list by UID drops.
	cut := both(t0)
	cut.Annotations[OriginStateAnnotation] = source.Disconnected.String()
	if _, err := honest.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), cut, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "disconnected", func() bool { return state() == source.Disconnected })
	time.Sleep(100 * time.Millisecond)
	if got := records(st, "origin-a"); !slices.Equal(got, []string{r1}) {
		t.Errorf("disconnected: %q, want the old web-0 still dropped", got)
	}

	// The hostile hub carries the list by UID again: current.
	if _, err := hostile.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), both(t1), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connected through the hub again", func() bool { return state() == source.Connected })
	if got := records(st, "origin-a"); !slices.Equal(got, []string{r1}) {
		t.Errorf("connected again: %q", got)
	}
	if got := ref.list(); slices.Contains(got, "hub-0 origin-a / withheld_pod_list") {
		t.Errorf("refused %q: the honest hub is not withholding", got)
	}
}

// With RequirePodUIDLists, a hub's Lease with a list by name but none by
// UID is withheld from the reader's first start (no list by UID ever
// seen): the origin is not connected through it, its records kept; a list
// by UID as new as the heartbeat makes it connected, and drops the old
// statement of a Pod made again under its name.
func TestRequirePodUIDLists(t *testing.T) {
	pub, priv := genKey(t)
	now := time.Now().Truncate(time.Millisecond)
	p := stmt{origin: "origin-a", ns: "prod", name: "web-0", uid: "uid-old", ip: "10.0.0.1", ready: true, seq: 1}.pod(priv)
	hub := newFakeHub(slice("prod", "backend", "origin-a", nil, p),
		listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now), priv, now, "web-0"))
	var ref refusals
	st := store.New()
	r := start(t, st, Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, RequirePodUIDLists: true, Events: ref.events()}, hub)
	rw := rec("prod", "web-0", "10.0.0.1", true, "backend")
	state := func() source.State { return originState(r) }
	eventually(t, "disconnected with a list by name only, the record kept", func() bool {
		return synced(r) && state() == source.Disconnected && slices.Equal(records(st, "origin-a"), []string{rw})
	})
	if o := r.Origins(); len(o) != 1 || !o[0].LastContact.IsZero() {
		t.Errorf("origins %v: want no last contact through a Lease without the required list by UID (its list by name is not one)", o)
	}
	if got, want := ref.list(), []string{"hub-0 origin-a / withheld_pod_list"}; !slices.Equal(got, want) {
		t.Errorf("refused %q, want %q", got, want)
	}
	t1 := now.Add(time.Millisecond)
	l := listingUIDs(listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, t1), priv, t1), priv, t1, "web-0"), priv, t1, [2]string{"web-0", "uid-new"})
	if _, err := hub.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connected with the list by UID, the old web-0 dropped", func() bool {
		return state() == source.Connected && len(records(st, "origin-a")) == 0
	})
}
