package relay

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// With Config.Namespaces, a hub's slices are read with one watch per
// namespace listed: the hub is never asked for another namespace, and a
// slice elsewhere, there at the start or made later, never arrives.
func TestRelayNamespaces(t *testing.T) {
	p := func(ns, name, ip string) Pod {
		return stmt{origin: "origin-a", ns: ns, name: name, ip: ip, ready: true, seq: 1}.pod(nil)
	}
	h := newFakeHub(
		slice("prod", "backend", "origin-a", nil, p("prod", "a", "10.0.0.1")),
		slice("shop", "backend", "origin-a", nil, p("shop", "b", "10.0.0.2")),
		slice("other", "backend", "origin-a", nil, p("other", "c", "10.0.0.3")),
	)
	st := store.New()
	r := start(t, st, Config{Namespaces: []string{"prod", "shop"}}, h)
	eventually(t, "three watches", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.watches) == 3 // prod's and shop's slices, the Leases
	})
	ra, rb := rec("prod", "a", "10.0.0.1", true, "backend"), rec("shop", "b", "10.0.0.2", true, "backend")
	eventually(t, "prod and shop", func() bool { return synced(r) && slices.Equal(records(st, "origin-a"), []string{ra, rb}) })

	// A slice made in another namespace, then a change in prod: once the
	// change arrived, the other slice would have too if it were watched.
	if _, err := h.DiscoveryV1().EndpointSlices("other").Create(t.Context(),
		slice("other", "more", "origin-a", nil, p("other", "d", "10.0.0.4")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.DiscoveryV1().EndpointSlices("prod").Update(t.Context(),
		slice("prod", "backend", "origin-a", nil, p("prod", "a", "10.0.0.1"), p("prod", "e", "10.0.0.5")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	re := rec("prod", "e", "10.0.0.5", true, "backend")
	eventually(t, "prod's change", func() bool { return slices.Equal(records(st, "origin-a"), []string{ra, re, rb}) })

	for _, a := range h.Actions() {
		if a.GetResource().Resource != "endpointslices" {
			continue
		}
		if _, ok := a.(k8stesting.ListAction); !ok {
			if _, ok := a.(k8stesting.WatchAction); !ok {
				continue // the test's own writes
			}
		}
		if ns := a.GetNamespace(); ns != "prod" && ns != "shop" {
			t.Errorf("%s of endpointslices in namespace %q", a.GetVerb(), ns)
		}
	}
}

// A namespace limit that is no list of namespace names is refused at
// Start, before any hub is read.
func TestRelayNamespacesChecked(t *testing.T) {
	many := make([]string, MaxNamespaces+1)
	for i := range many {
		many[i] = fmt.Sprintf("ns-%d", i)
	}
	for _, tc := range []struct {
		name       string
		namespaces []string
		want       string
	}{
		{"bad name", []string{"prod", "Prod"}, `namespace "Prod"`},
		{"twice", []string{"prod", "prod"}, `namespace "prod" named twice`},
		{"too many", many, "more than 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(store.New(), Config{Namespaces: tc.namespaces})
			if err := r.AddHub("hub-0", newFakeHub(), ""); err != nil {
				t.Fatal(err)
			}
			err := r.Start()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// A hub read namespace by namespace counts once every namespace listed:
// then the origins of every namespace are written, not only those of the
// namespace that listed last (here with another hub down, so that every
// origin is not written again for all hubs having listed).
func TestRelayNamespacesEveryPartWritten(t *testing.T) {
	p := func(origin, ns, name, ip string) Pod {
		return stmt{origin: origin, ns: ns, name: name, ip: ip, ready: true, seq: 1}.pod(nil)
	}
	h0 := newFakeHub(
		slice("prod", "backend", "origin-a", nil, p("origin-a", "prod", "a", "10.0.0.1")),
		slice("shop", "backend", "origin-b", nil, p("origin-b", "shop", "b", "10.0.0.2")),
	)
	h1 := newFakeHub()
	h1.down(true)
	st := store.New()
	start(t, st, Config{Namespaces: []string{"prod", "shop"}}, h0, h1)
	ra, rb := rec("prod", "a", "10.0.0.1", true, "backend"), rec("shop", "b", "10.0.0.2", true, "backend")
	eventually(t, "both namespaces' origins", func() bool {
		return slices.Equal(records(st, "origin-a"), []string{ra}) && slices.Equal(records(st, "origin-b"), []string{rb})
	})
}
