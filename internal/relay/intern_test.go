package relay

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// unshared returns the first entry of origin's slices on r's hubs that is
// not the record st holds of its Pod, or whose record is on another Common
// than the store's records of the slice's other Pods; "" when there is none.
func unshared(r *Relay, st *store.Store, origin string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.hubs {
		for _, s := range h.byOrigin[origin] {
			for _, e := range s.entries {
				held := st.Get(e.rec.Key())
				switch {
				case held == nil:
					return fmt.Sprintf("%s: %s/%s: the store holds no record", h.name, s.Namespace, e.rec.Name)
				case !held.Equal(e.rec):
					continue // another statement than the store's (a hub lagging)
				case held != e.rec:
					return fmt.Sprintf("%s: %s/%s: a copy of the store's record", h.name, s.Namespace, e.rec.Name)
				case e.rec.Common != s.entries[0].rec.Common:
					return fmt.Sprintf("%s: %s/%s: another Common than %s's", h.name, s.Namespace, e.rec.Name, s.entries[0].rec.Name)
				}
			}
		}
	}
	return ""
}

// sameEntries reports whether the hubs' slices of origin in ns named name
// hold one array of entries.
func sameEntries(r *Relay, origin, ns, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first *entry
	for _, h := range r.hubs {
		for _, s := range h.byOrigin[origin] {
			if s.Namespace != ns || s.Name != name || len(s.entries) == 0 {
				continue
			}
			switch {
			case first == nil:
				first = &s.entries[0]
			case first != &s.entries[0]:
				return false
			}
		}
	}
	return first != nil
}

// A Pod that two hubs hold with the same statement is one record, the
// store's, which both hubs' slices hold (and so is its Common): first the
// records a snapshot loaded, then those a hub brought. A new statement of
// one Pod is a record of its own, on the Common its slice's other records
// share, until the other hub holds it too. Two hubs' slices of one key (hubs
// name an origin's slices alike) that say the same hold one array of
// entries.
func TestRelaySharesRecords(t *testing.T) {
	pod := func(name, ip string, ready bool, seq uint64) Pod {
		return stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: ready, seq: seq}.pod(nil)
	}
	exports, _ := annotation.ParseExports(backend, "prod", "origin-a")
	snap := &store.Common{Cluster: "origin-a", Namespace: "prod", Exports: exports}
	st := store.New()
	st.ReplaceCluster("origin-a", []*store.Pod{
		{Common: snap, Name: "a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ready: true},
		{Common: snap, Name: "b", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Ready: true},
	})
	loaded := st.Pods("origin-a")
	both := slice("prod", "backend", "origin-a", nil, pod("a", "10.0.0.1", true, 1), pod("b", "10.0.0.2", true, 1), pod("c", "10.0.0.3", true, 1))
	now := time.Now()
	hubs := []*fakeHub{
		newFakeHub(both.DeepCopy(), lease(DefaultNamespace, "origin-a", source.Connected, now)),
		newFakeHub(both.DeepCopy(), lease(DefaultNamespace, "origin-a", source.Connected, now)),
	}
	r := start(t, st, Config{}, hubs...)
	ra, rb, rc := rec("prod", "a", "10.0.0.1", true, "backend"), rec("prod", "b", "10.0.0.2", true, "backend"), rec("prod", "c", "10.0.0.3", true, "backend")
	eventually(t, "every record", func() bool {
		return slices.Equal(records(st, "origin-a"), []string{ra, rb, rc}) && synced(r)
	})
	eventually(t, "one record of each Pod", func() bool { return unshared(r, st, "origin-a") == "" })
	for _, p := range loaded {
		if st.Get(p.Key()) != p {
			t.Errorf("%s: the store no longer holds the snapshot's record", p.Name)
		}
	}
	if !sameEntries(r, "origin-a", "prod", "backend") {
		t.Error("the hubs' slices hold an array of entries each")
	}

	// b is no longer ready: hub-0 has the new statement first, then hub-1.
	changed := slice("prod", "backend", "origin-a", nil, pod("a", "10.0.0.1", true, 1), pod("b", "10.0.0.2", false, 2), pod("c", "10.0.0.3", true, 1))
	rb = rec("prod", "b", "10.0.0.2", false, "backend")
	for i, h := range hubs {
		if _, err := h.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), changed.DeepCopy(), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("hub-%d's change", i), func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, s := range r.hubs[i].byOrigin["origin-a"] {
				for _, e := range s.entries {
					if e.rec.Name == "b" && e.seq == 2 {
						return true
					}
				}
			}
			return false
		})
		eventually(t, "the new statement", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra, rb, rc}) })
		if u := unshared(r, st, "origin-a"); u != "" {
			t.Fatalf("after hub-%d's change: %s", i, u)
		}
		if same := sameEntries(r, "origin-a", "prod", "backend"); same != (i == 1) {
			t.Errorf("after hub-%d's change: one array of entries: %t", i, same)
		}
	}
}

var keySink string

// A relay slice's namespace, name, store key, version, UID and origin are
// one string: its key (which ingest.Store looks it up by, at every event)
// costs no allocation, and each is what the slice says.
func TestSlimSliceKey(t *testing.T) {
	r := New(store.New(), Config{})
	es := slice("prod", "backend-x1", "origin-a", nil, stmt{origin: "origin-a", ns: "prod", name: "a", ip: "10.0.0.1", ready: true, seq: 1}.pod(nil))
	es.ResourceVersion, es.UID = "4711", "0b5e7c1a-2f4d-4e8b-9c3a-5d6e7f809a1b"
	s := r.toSlim(es)
	if s.Namespace != "prod" || s.Name != "backend-x1" || s.origin != "origin-a" || s.Key() != "prod/backend-x1" || len(s.entries) != 1 ||
		!s.Same(ingest.MetaOf(es)) || s.ResourceVersion != "4711" || s.UID != es.UID {
		t.Fatalf("namespace %q, name %q, version %q, UID %q, origin %q, key %q, %d entries", s.Namespace, s.Name, s.ResourceVersion, s.UID, s.origin, s.Key(), len(s.entries))
	}
	if c := s.entries[0].rec.Common; c.Cluster != "origin-a" || c.Namespace != "prod" {
		t.Errorf("record of cluster %q, namespace %q", c.Cluster, c.Namespace)
	}
	if n := testing.AllocsPerRun(100, func() { keySink = s.Key() }); n != 0 {
		t.Errorf("Key: %v allocations", n)
	}
	// A slice that relays nothing keeps its names as they came.
	own := r.toSlim(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "own"}})
	if own.Key() != "prod/own" {
		t.Errorf("key of a slice without the annotation: %q", own.Key())
	}
}
