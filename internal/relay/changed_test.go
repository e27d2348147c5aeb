package relay

import (
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Events.OriginChanged follows every change of what Origin says of an
// origin, and a listener that asks Origin at each one ends with the
// relay's view: a new origin, its Lease saying it lost it, and an origin
// forgotten once no hub holds anything of it.
func TestOriginChangedEvents(t *testing.T) {
	var (
		mu   sync.Mutex
		last = map[string]*Origin{} // by origin: what Origin said at its last event; nil once forgotten
		r    *Relay
	)
	events := Events{OriginChanged: func(name string) {
		o, ok := r.Origin(name)
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			last[name] = nil
			return
		}
		last[name] = &o
	}}
	seen := func(name string) (*Origin, bool) {
		mu.Lock()
		defer mu.Unlock()
		o, ok := last[name]
		return o, ok
	}
	h := newFakeHub(slice("prod", "backend-a", "origin-a", nil, stmt{origin: "origin-a", ns: "prod", name: "a", ip: "10.0.0.1", ready: true, seq: 1}.pod(nil)),
		lease(DefaultNamespace, "origin-a", source.Connected, time.Now()),
		slice("prod", "backend-b", "origin-b", nil, stmt{origin: "origin-b", ns: "prod", name: "b", ip: "10.0.0.2", ready: true, seq: 1}.pod(nil)))
	st := store.New()
	r = New(st, Config{Events: events})
	if err := r.AddHub("hub-0", h, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Origin("origin-a"); ok {
		t.Fatal("Origin knows origin-a before any hub said anything of it")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })

	eventually(t, "origin-a connected, through hub-0", func() bool {
		o, _ := seen("origin-a")
		return o != nil && o.State == source.Connected && len(o.Hubs) == 1 && o.Hubs[0] == "hub-0" && o.Records == 1
	})

	lost := time.Now().Add(-10 * time.Minute).Truncate(time.Microsecond)
	if _, err := h.CoordinationV1().Leases(DefaultNamespace).Update(t.Context(), lease(DefaultNamespace, "origin-a", source.Disconnected, lost), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "origin-a lost ten minutes ago", func() bool {
		o, _ := seen("origin-a")
		return o != nil && o.State == source.Disconnected && o.LastContact.Equal(lost)
	})

	if err := h.DiscoveryV1().EndpointSlices("prod").Delete(t.Context(), "backend-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "origin-b forgotten", func() bool {
		o, ok := seen("origin-b")
		return ok && o == nil
	})
	if _, ok := r.Origin("origin-b"); ok {
		t.Error("Origin still knows origin-b")
	}

}
