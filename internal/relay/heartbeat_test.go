package relay

import (
	"crypto/ed25519"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// beating returns l carrying its origin's heartbeat of at, signed with key,
// as a hub copies it from the origin.
func beating(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time) *coordinationv1.Lease {
	origin := l.Labels[OriginLabel]
	hb := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: origin, Time: at.UnixMilli()})
	l.Annotations[HeartbeatAnnotation] = hb
	l.Annotations[HeartbeatSignatureAnnotation] = annotation.SignHeartbeat(key, origin, hb)
	return l
}

// A hub's Lease saying its origin is connected makes the hub current on it
// under verify only with a heartbeat of the origin that verifies and is
// recent; otherwise the origin is disconnected through that hub, its
// records are kept as for a hub cut off (Expire's stay out), and the
// refusal is reported once. Without verify the Lease is taken at its word.
func TestHeartbeatMakesHubCurrent(t *testing.T) {
	pub, priv := genKey(t)
	pubB, privB := genKey(t)
	_, other := genKey(t)
	now := time.Now()
	connected := func() *coordinationv1.Lease { return lease(DefaultNamespace, "origin-a", source.Connected, now) }
	fresh := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: "origin-a", Time: now.UnixMilli()})
	with := func(beat, sig string) *coordinationv1.Lease {
		l := connected()
		l.Annotations[HeartbeatAnnotation] = beat
		l.Annotations[HeartbeatSignatureAnnotation] = sig
		return l
	}
	bBeat := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: "origin-b", Time: now.UnixMilli()})
	for _, tc := range []struct {
		name    string
		lease   *coordinationv1.Lease
		current bool   // under verify
		reason  string // the refusal under verify; "" none
	}{
		{"fresh heartbeat", beating(connected(), priv, now), true, ""},
		{"heartbeat a little ahead", beating(connected(), priv, now.Add(HeartbeatSkew/2)), true, ""},
		{"stale heartbeat", beating(connected(), priv, now.Add(-time.Hour)), false, "stale_heartbeat"},
		{"heartbeat far ahead", beating(connected(), priv, now.Add(time.Hour)), false, "stale_heartbeat"},
		{"no heartbeat", connected(), false, "bad_heartbeat"},
		{"unsigned heartbeat", with(fresh, ""), false, "bad_heartbeat"},
		{"forged heartbeat (another key)", with(fresh, annotation.SignHeartbeat(other, "origin-a", fresh)), false, "bad_heartbeat"},
		{"tampered heartbeat", with(strings.Replace(fresh, `"time":`, `"time":1`, 1), annotation.SignHeartbeat(priv, "origin-a", fresh)), false, "bad_heartbeat"},
		{"another origin's heartbeat", with(bBeat, annotation.SignHeartbeat(privB, "origin-b", bBeat)), false, "bad_heartbeat"},
		{"malformed heartbeat", with(`{"cluster":"origin-a"}`, annotation.SignHeartbeat(priv, "origin-a", `{"cluster":"origin-a"}`)), false, "bad_heartbeat"},
	} {
		for _, verify := range []bool{true, false} {
			name := tc.name + " without verify"
			var keys map[string]ed25519.PublicKey
			if verify {
				name = tc.name + " under verify"
				keys = map[string]ed25519.PublicKey{"origin-a": pub, "origin-b": pubB}
			}
			t.Run(name, func(t *testing.T) {
				h := newFakeHub(slice("prod", "backend", "origin-a", nil,
					stmt{origin: "origin-a", ns: "prod", name: "a", ip: "10.0.0.1", ready: true, seq: 1}.pod(priv)), tc.lease)
				var ref refusals
				st := store.New()
				r := start(t, st, Config{Keys: keys, Events: ref.events()}, h)
				eventually(t, "synced", func() bool { return synced(r) && len(records(st, "origin-a")) == 1 })
				current := tc.current || !verify
				want := source.Disconnected
				if current {
					want = source.Connected
				}
				eventually(t, "origin state "+want.String(), func() bool {
					o := r.Origins()
					return len(o) == 1 && o[0].State == want
				})
				// Expire drops the records; a current hub brings them back
				// at once, a hub not current does not.
				r.Expire("origin-a")
				if n := len(records(st, "origin-a")); (n == 1) != current {
					t.Errorf("after Expire: %d records; current %v", n, current)
				}
				var refused []string
				if verify && tc.reason != "" {
					refused = []string{"hub-0 origin-a / " + tc.reason}
				}
				if verify && (tc.reason == "" || tc.reason == "stale_heartbeat") {
					// A heartbeat that verifies, without a Pod list.
					refused = append([]string{"hub-0 origin-a / no_pod_list"}, refused...)
				}
				time.Sleep(50 * time.Millisecond)
				if got := ref.list(); !slices.Equal(got, refused) {
					t.Errorf("refused %q, want %q", got, refused)
				}
			})
		}
	}
}

// A heartbeat that gets too old turns the origin disconnected without any
// event from the hub, the refusal reported once; the origin's last contact
// is its newest heartbeat any hub holds (an older one replayed by another
// hub does not move it back); a new heartbeat makes it connected again.
func TestHeartbeatGoesStale(t *testing.T) {
	pub, priv := genKey(t)
	const timeout = 400 * time.Millisecond
	t0 := time.Now().Truncate(time.Millisecond)
	old := t0.Add(-time.Hour)
	h0 := newFakeHub(beating(lease(DefaultNamespace, "origin-a", source.Connected, t0), priv, t0))
	h1 := newFakeHub(beating(lease(DefaultNamespace, "origin-a", source.Connected, t0), priv, old))
	var ref refusals
	r := start(t, store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, HeartbeatTimeout: timeout, Events: ref.events()}, h0, h1)
	eventually(t, "connected through hub-0, last contact its heartbeat", func() bool {
		o := r.Origins()
		return len(o) == 1 && o[0].State == source.Connected && o[0].LastContact.Equal(t0)
	})
	eventually(t, "disconnected once the heartbeat is too old", func() bool {
		o := r.Origins()
		return len(o) == 1 && o[0].State == source.Disconnected && o[0].LastContact.Equal(t0)
	})
	stale := []string{"hub-0 origin-a / no_pod_list", "hub-0 origin-a / stale_heartbeat", "hub-1 origin-a / no_pod_list", "hub-1 origin-a / stale_heartbeat"}
	time.Sleep(3 * timeout) // more looks: no more reports
	if got := ref.list(); !slices.Equal(got, stale) {
		t.Errorf("refused %q, want %q", got, stale)
	}
	t1 := time.Now().Truncate(time.Millisecond)
	if _, err := h0.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(),
		beating(lease(DefaultNamespace, "origin-a", source.Connected, t1), priv, t1), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "connected again", func() bool {
		o := r.Origins()
		return len(o) == 1 && o[0].State == source.Connected && o[0].LastContact.Equal(t1)
	})
}

// The hub's renewTime is its word alone: under verify a Lease saying
// disconnected with a renewTime of now does not make the origin look
// recent; its heartbeat does.
func TestHeartbeatNotRenewTime(t *testing.T) {
	pub, priv := genKey(t)
	beat := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	h := newFakeHub(beating(lease(DefaultNamespace, "origin-a", source.Disconnected, time.Now()), priv, beat))
	r := start(t, store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}}, h)
	eventually(t, "last contact the heartbeat's", func() bool {
		o := r.Origins()
		return len(o) == 1 && o[0].State == source.Disconnected && o[0].LastContact.Equal(beat)
	})
}

// A refusal of a hub's word is reported once per verdict, not once per
// heartbeat: a hub that passes an origin's fresh heartbeats without their
// Pod lists, or heartbeats far ahead of the reader's clock, changes the
// refusal's times at every heartbeat.
func TestHeartbeatRefusalOncePerVerdict(t *testing.T) {
	pub, priv := genKey(t)
	now := time.Now().Truncate(time.Millisecond)
	listed := listing(beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, now), priv, now, "p")
	hub := newFakeHub(slice("prod", "backend", "origin-a", nil), listed)
	var ref refusals
	r := start(t, store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}, Events: ref.events()}, hub)
	eventually(t, "connected", func() bool { o := r.Origins(); return synced(r) && len(o) == 1 && o[0].State == source.Connected })
	count := func(reason string) int {
		n := 0
		for _, s := range ref.list() {
			if strings.HasSuffix(s, " "+reason) {
				n++
			}
		}
		return n
	}
	for i, at := range []func(int) time.Time{
		func(i int) time.Time { return now.Add(time.Duration(i+1) * time.Second) }, // fresh, without the list
		func(i int) time.Time { return now.Add(time.Hour + time.Duration(i)*time.Second) },
	} {
		reason := []string{"withheld_pod_list", "stale_heartbeat"}[i]
		for j := range 4 {
			l := beating(lease(DefaultNamespace, "origin-a", source.Connected, now), priv, at(j))
			if _, err := hub.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the Lease taken", func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				hl := r.hubs[0].leases["origin-a"]
				return hl != nil && hl.beat.Equal(at(j))
			})
		}
		time.Sleep(50 * time.Millisecond)
		if n := count(reason); n != 1 {
			t.Errorf("%s reported %d times over 4 heartbeats, want once: %q", reason, n, ref.list())
		}
	}
}

// Each way a hub's word on a connected origin is refused gets its reason
// from beatVerdict and the matching detail from beatRefusal; a word taken
// gets neither.
func TestBeatVerdictAndRefusal(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	seen := &podList{at: uint64(now.UnixMilli())}
	for _, c := range []struct {
		name   string
		l      slimLease
		seen   *podList // the newest list of the origin seen
		keys   bool
		reason annotation.Reason
		detail string
	}{
		{name: "without verify", l: slimLease{state: source.Connected}},
		{name: "not connected", keys: true, l: slimLease{state: source.Disconnected}},
		{name: "fresh heartbeat", keys: true, l: slimLease{state: source.Connected, beat: now.Add(-time.Second)}},
		{name: "fresh heartbeat and list", keys: true, seen: seen,
			l: slimLease{state: source.Connected, beat: now, list: &podList{at: uint64(now.UnixMilli())}}},
		{name: "no heartbeat that verifies", keys: true, reason: ReasonHeartbeat, detail: "without a heartbeat of it that verifies (forged)",
			l: slimLease{state: source.Connected, beatRefused: annotation.Rejection{Detail: "forged"}}},
		{name: "heartbeat ahead", keys: true, reason: ReasonStaleHeartbeat, detail: "ahead of this clock",
			l: slimLease{state: source.Connected, beat: now.Add(time.Hour)}},
		{name: "heartbeat too old", keys: true, reason: ReasonStaleHeartbeat, detail: "over " + DefaultHeartbeatTimeout.String() + " ago",
			l: slimLease{state: source.Connected, beat: now.Add(-time.Hour)}},
		{name: "list withheld", keys: true, seen: seen, reason: ReasonWithheldPodList, detail: "no Pod list that verifies (unsigned), although one of",
			l: slimLease{state: source.Connected, beat: now, listRefused: annotation.Rejection{Detail: "unsigned"}}},
		{name: "list older than the heartbeat", keys: true, seen: seen, reason: ReasonWithheldPodList, detail: "older than the heartbeat",
			l: slimLease{state: source.Connected, beat: now, list: &podList{at: uint64(now.Add(-time.Second).UnixMilli())}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Relay{origins: map[string]*origin{"origin-a": {list: c.seen}}}
			if c.keys {
				r.cfg.Keys = map[string]ed25519.PublicKey{}
			}
			c.l.origin = "origin-a"
			reason, ok := r.beatVerdict(&c.l, now)
			if reason != c.reason || ok != (c.reason == "") {
				t.Fatalf("beatVerdict: %q, %v; want %q", reason, ok, c.reason)
			}
			if ok {
				return
			}
			rej := r.beatRefusal(&c.l, now, reason)
			if rej.Reason != c.reason || rej.Index != -1 || !strings.Contains(rej.Detail, c.detail) || !strings.Contains(rej.Detail, "cluster origin-a") {
				t.Errorf("beatRefusal: %+v; want reason %q and a detail naming the cluster with %q", rej, c.reason, c.detail)
			}
		})
	}
}
