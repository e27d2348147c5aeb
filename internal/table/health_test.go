package table

import (
	"slices"
	"sync"
	"testing"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// A down endpoint leaves the service's A, AAAA and SRV answers and its own
// name; it returns when marked up; all down answers all of them (fail open).
func TestSetDown(t *testing.T) {
	tb := newTable(cfg())
	b1 := pod("edge-b", "default", "b1", "", true, []string{"10.1.0.1", "fd00::1"}, export("backend", httpPort))
	b2 := pod("edge-b", "default", "b2", "", true, []string{"10.1.0.2"}, export("backend", httpPort))
	tb.Upsert(b1)
	tb.Upsert(b2)
	tb.Upsert(pod("edge-b", "default", "o1", "", true, []string{"10.1.0.9"}, export("other", httpPort)))
	svc := "backend.default.svc." + zone
	check := func(step string, ix *Index, wantA, wantSRV []string, b1Name bool, failOpen bool) {
		t.Helper()
		a := ix.Lookup(svc, dns.TypeA)
		if got := addrs(a); !slices.Equal(got, wantA) {
			t.Errorf("%s: A %v, want %v", step, got, wantA)
		}
		if a.FailOpen != failOpen {
			t.Errorf("%s: FailOpen %v, want %v", step, a.FailOpen, failOpen)
		}
		if got := srvs(ix.Lookup("_http._tcp."+svc, dns.TypeSRV)); !slices.Equal(got, wantSRV) {
			t.Errorf("%s: SRV %v, want %v", step, got, wantSRV)
		}
		name := ix.Lookup("10-1-0-1.edge-b."+svc, dns.TypeAAAA)
		if has := name.Kind == KindEndpoint; has != b1Name {
			t.Errorf("%s: b1's name answers %v (%s), want %v", step, has, name.Kind, b1Name)
		}
		if o := ix.Lookup("other.default.svc."+zone, dns.TypeA); len(o.A) != 1 || o.FailOpen {
			t.Errorf("%s: another service changed: %+v", step, o)
		}
	}
	both := []string{"8080 10-1-0-1.edge-b." + svc, "8080 10-1-0-2.edge-b." + svc}
	check("all up", tb.Rebuild(), []string{"10.1.0.1", "10.1.0.2"}, both, true, false)

	tb.SetDown("default", "backend", b1.Key(), true)
	check("b1 down", tb.Rebuild(), []string{"10.1.0.2"}, []string{"8080 10-1-0-2.edge-b." + svc}, false, false)
	if a := tb.Index().Lookup(svc, dns.TypeAAAA); a.Kind != KindNoData {
		t.Errorf("b1 down: AAAA %s, want nodata (b1 had the only IPv6 address)", a.Kind)
	}

	tb.SetDown("default", "backend", b2.Key(), true)
	check("all down: fail open", tb.Rebuild(), []string{"10.1.0.1", "10.1.0.2"}, both, true, true)

	tb.SetDown("default", "backend", b1.Key(), false)
	check("b1 back", tb.Rebuild(), []string{"10.1.0.1"}, []string{"8080 10-1-0-1.edge-b." + svc}, true, false)

	tb.SetDown("default", "backend", b2.Key(), false)
	check("all back", tb.Rebuild(), []string{"10.1.0.1", "10.1.0.2"}, both, true, false)
	if len(tb.down) != 0 {
		t.Errorf("marks left: %v", tb.down)
	}
}

// A down mark of a service's endpoint does not touch the Pod's other
// services, and a Pod that is not ready stays out whatever its mark.
func TestSetDownPerService(t *testing.T) {
	tb := newTable(cfg())
	p := pod("edge-b", "default", "p", "", true, []string{"10.1.0.1"}, export("one", httpPort), export("two", httpPort))
	q := pod("edge-b", "default", "q", "", true, []string{"10.1.0.2"}, export("one", httpPort), export("two", httpPort))
	tb.Upsert(p)
	tb.Upsert(q)
	tb.Upsert(pod("edge-b", "default", "r", "", false, []string{"10.1.0.3"}, export("one", httpPort)))
	tb.SetDown("default", "one", p.Key(), true)
	ix := tb.Rebuild()
	if got := addrs(ix.Lookup("one.default.svc."+zone, dns.TypeA)); !slices.Equal(got, []string{"10.1.0.2"}) {
		t.Errorf("one: %v", got)
	}
	if got := addrs(ix.Lookup("two.default.svc."+zone, dns.TypeA)); !slices.Equal(got, []string{"10.1.0.1", "10.1.0.2"}) {
		t.Errorf("two: %v", got)
	}
	tb.SetDown("default", "one", q.Key(), true)
	ix = tb.Rebuild()
	if got := addrs(ix.Lookup("one.default.svc."+zone, dns.TypeA)); !slices.Equal(got, []string{"10.1.0.1", "10.1.0.2"}) {
		t.Errorf("one, fail open: %v (the not-ready r must stay out)", got)
	}
	// Records changing under a mark keep it: the service renders without it.
	tb.Upsert(pod("edge-b", "default", "s", "", true, []string{"10.1.0.4"}, export("one", httpPort)))
	ix = tb.Rebuild()
	if a := ix.Lookup("one.default.svc."+zone, dns.TypeA); !slices.Equal(addrs(a), []string{"10.1.0.4"}) || a.FailOpen {
		t.Errorf("one, with a new endpoint: %v (fail open %v)", addrs(a), a.FailOpen)
	}
}

// Asked reports each looked-up service once per call, by Lookup and by
// LookupService; only when tracked.
func TestAsked(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-a", "default", "f1", "", true, []string{"10.0.0.2"}, export("front", httpPort)))
	tb.Upsert(pod("edge-a", "default", "q1", "", true, []string{"10.0.0.3"}, export("quiet", httpPort)))
	asked := func() []string {
		var out []string
		tb.Asked(func(ns, name string) { out = append(out, name+"."+ns) })
		slices.Sort(out)
		return out
	}
	ix := tb.Rebuild()
	ix.Lookup("backend.default.svc."+zone, dns.TypeA)
	if got := asked(); got != nil {
		t.Errorf("untracked: %v", got)
	}
	tb.TrackDemand()
	ix = tb.Rebuild()
	for range 3 {
		ix.Lookup("backend.default.svc."+zone, dns.TypeA)
		ix.Lookup("_http._tcp.backend.default.svc."+zone, dns.TypeSRV)
	}
	ix.LookupService("default", "front", "", "", dns.TypeA)
	ix.Lookup("nope.default.svc."+zone, dns.TypeA)
	if got, want := asked(), []string{"backend.default", "front.default"}; !slices.Equal(got, want) {
		t.Errorf("asked %v, want %v", got, want)
	}
	if got := asked(); got != nil {
		t.Errorf("asked again with no query: %v", got)
	}
	ix.Lookup("backend.default.svc."+zone, dns.TypeA)
	if got, want := asked(), []string{"backend.default"}; !slices.Equal(got, want) {
		t.Errorf("asked after a new query %v, want %v", got, want)
	}
}

// Marking is safe against concurrent queries and takes (run with -race), and
// every asked service is reported at least once.
func TestAskedConcurrent(t *testing.T) {
	tb := newTable(cfg())
	names := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}
	for i, n := range names {
		tb.Upsert(pod("edge-a", "default", n, "", true, []string{"10.0.0." + string(rune('1'+i))}, export(n, httpPort)))
	}
	tb.TrackDemand()
	ix := tb.Rebuild()
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				ix.Lookup(names[(i+w)%len(names)]+".default.svc."+zone, dns.TypeA)
			}
		})
	}
	for range 50 {
		tb.Asked(func(_, name string) { seen[name] = true })
	}
	wg.Wait()
	tb.Asked(func(_, name string) { seen[name] = true })
	if len(seen) != len(names) {
		t.Errorf("seen %v, want all of %v", seen, names)
	}
}

// With demand tracked and an endpoint down, lookups still allocate nothing.
func TestLookupWithHealthDoesNotAllocate(t *testing.T) {
	tb := newTable(cfg())
	b1 := pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort))
	tb.Upsert(b1)
	tb.Upsert(pod("edge-a", "default", "b2", "", true, []string{"10.0.0.2"}, export("backend", httpPort)))
	tb.TrackDemand()
	tb.SetDown("default", "backend", b1.Key(), true)
	ix := tb.Rebuild()
	for _, q := range []string{"backend.default.svc." + zone, "_http._tcp.backend.default.svc." + zone, "10-0-0-2.edge-a.backend.default.svc." + zone} {
		if n := testing.AllocsPerRun(100, func() {
			ix.Lookup(q, dns.TypeA)
			tb.Asked(func(_, _ string) {}) // so that each run marks again
		}); n != 0 {
			t.Errorf("%s: %v allocations", q, n)
		}
	}
}

func TestMembers(t *testing.T) {
	tb := newTable(cfg())
	tb.Upsert(pod("edge-a", "default", "b1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
	tb.Upsert(pod("edge-b", "default", "b2", "", false, []string{"10.1.0.1"}, export("backend", httpPort)))
	tb.Rebuild()
	got := tb.Members("default", "backend")
	if len(got) != 2 {
		t.Fatalf("%d members, want 2", len(got))
	}
	got[0] = nil // the caller's copy
	if m := tb.Members("default", "backend"); m[0] == nil || m[1] == nil {
		t.Error("Members handed out the table's own list")
	}
	if m := tb.Members("default", "nope"); len(m) != 0 {
		t.Errorf("unknown service: %v", m)
	}
}

// Who may resolve a service does not depend on health: an endpoint marked
// down still counts with its allowedNamespaces (a service allows only what
// every entry allows), so a probe can never widen access.
func TestSetDownKeepsAccess(t *testing.T) {
	tb := newTable(cfg())
	open := annotation.Export{Name: "backend", Allowed: []string{"web"}, Ports: []annotation.Port{httpPort}}
	closed := annotation.Export{Name: "backend", Ports: []annotation.Port{httpPort}}
	tb.Upsert(pod("edge-a", "default", "a1", "", true, []string{"10.0.0.1"}, open))
	tb.Upsert(pod("edge-a", "default", "a2", "", true, []string{"10.0.0.2"}, closed))
	if tb.Rebuild().Allowed("default", "backend", "web") {
		t.Fatalf("allowed with one entry that does not allow web")
	}
	tb.SetDown("default", "backend", store.Key{Cluster: "edge-a", Namespace: "default", Name: "a2"}, true)
	ix := tb.Rebuild()
	if got := addrs(ix.Lookup("backend.default.svc."+zone, dns.TypeA)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("a2 down: A %v, want only 10.0.0.1", got)
	}
	if ix.Allowed("default", "backend", "web") {
		t.Errorf("a2 down: web may resolve backend: a probe widened access")
	}
}
