package relay

import (
	"crypto/ed25519"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Expire drops an origin's records and keeps them out while its hub holds
// them and changes them but is not in contact with the origin; once the
// hub's Lease says it is in contact again, the hub's records come back, the
// changes made meanwhile included. With and without verify.
func TestRelayExpire(t *testing.T) {
	pub, priv := genKey(t)
	for _, tc := range []struct {
		name string
		keys map[string]ed25519.PublicKey
	}{
		{"without verify", nil},
		{"with verify", map[string]ed25519.PublicKey{"origin-a": pub}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := func(name, ip string, seq uint64) Pod {
				return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: seq}.pod(priv)
			}
			lease := func(ns, origin string, state source.State, at time.Time) *coordinationv1.Lease {
				l := lease(ns, origin, state, at)
				if tc.keys != nil { // under verify, the origin's heartbeat of then
					l = beating(l, priv, at)
				}
				return l
			}
			h := newFakeHub(slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1", 1)),
				lease(DefaultNamespace, "origin-a", source.Disconnected, time.Now().Add(-time.Hour)))
			st := store.New()
			r := start(t, st, Config{Keys: tc.keys}, h)
			ra := rec("prod", "a", "10.0.0.1", true, "backend")
			eventually(t, "a", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra}) })

			if r.Expire("origin-b") {
				t.Errorf("Expire of an origin never seen: true")
			}
			if !r.Expire("origin-a") {
				t.Fatal("Expire: false")
			}
			if got := records(st, "origin-a"); len(got) > 0 {
				t.Fatalf("after Expire: %q", got)
			}
			if o := r.Origins(); len(o) != 1 || !o[0].Expired || o[0].Records != 0 {
				t.Errorf("origins %+v, want origin-a expired with no record", o)
			}
			// The hub changes the origin's slice, still out of contact with
			// it: nothing comes back.
			if _, err := h.DiscoveryV1().EndpointSlices("prod").Update(t.Context(),
				slice("prod", "backend", "origin-a", nil, p("a", "10.0.0.1", 1), p("b", "10.0.0.2", 1)), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the change applied", func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				n := 0
				for _, s := range r.hubs[0].byOrigin["origin-a"] {
					n += len(s.entries)
				}
				return n == 2
			})
			if got := records(st, "origin-a"); len(got) > 0 {
				t.Fatalf("expired, a slice changed: %q", got)
			}
			// A newer Lease, still saying disconnected.
			l := lease(DefaultNamespace, "origin-a", source.Disconnected, time.Now().Add(-time.Minute))
			if _, err := h.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the Lease applied", func() bool {
				o := r.Origins()
				return len(o) == 1 && time.Since(o[0].LastContact) < 30*time.Minute
			})
			if got := records(st, "origin-a"); len(got) > 0 {
				t.Fatalf("expired, hub out of contact with the origin: %q", got)
			}
			// The hub is in contact again: its records come back.
			l = lease(DefaultNamespace, "origin-a", source.Connected, time.Now())
			if _, err := h.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			rb := rec("prod", "b", "10.0.0.2", true, "backend")
			eventually(t, "back", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra, rb}) })
			if o := r.Origins(); len(o) != 1 || o[0].Expired || o[0].Records != 2 {
				t.Errorf("origins %+v, want origin-a with 2 records, not expired", o)
			}
		})
	}
}
