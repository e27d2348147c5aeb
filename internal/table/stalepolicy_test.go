package table

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The policy matrix: each policy of the peer's export entry, with the peer
// in contact, out of contact within the entry's grace and past it, with and
// without ready local endpoints. Serve keeps the peer's endpoints; Drop
// drops them past the grace; DropIfLocal only when there are local ones.
func TestStalePolicy(t *testing.T) {
	const grace = 30 * time.Second
	for _, policy := range []string{"", annotation.StaleServe, annotation.StaleDrop, annotation.StaleDropIfLocal} {
		for _, staleFor := range []time.Duration{0, grace - time.Second, grace, grace + time.Second} {
			for _, local := range []bool{false, true} {
				t.Run(fmt.Sprintf("%q/%s/local=%t", policy, staleFor, local), func(t *testing.T) {
					c := cfg()
					c.Locality = Any
					tb := newTable(c)
					peer := export("backend", httpPort)
					peer.StaleEndpoints = policy
					if policy == annotation.StaleDrop || policy == annotation.StaleDropIfLocal {
						peer.StaleGraceSeconds = int32(grace / time.Second)
					}
					tb.Upsert(pod("edge-b", "default", "b1", "", true, []string{"10.1.0.1"}, peer))
					if local {
						tb.Upsert(pod("edge-a", "default", "a1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
					}
					tb.Rebuild()
					tb.SetStaleFor("edge-b", staleFor)
					ix := tb.Rebuild()

					past := staleFor > grace
					dropped := past && (policy == annotation.StaleDrop || (policy == annotation.StaleDropIfLocal && local))
					var want []string
					if local {
						want = append(want, "10.0.0.1")
					}
					if !dropped {
						want = append(want, "10.1.0.1")
					}
					a := ix.Lookup("backend.default.svc."+zone, dns.TypeA)
					if got := addrs(a); !slices.Equal(got, want) {
						t.Errorf("service addresses %v, want %v", got, want)
					}
					// The endpoint name and the SRV answer follow.
					host := ix.Lookup("10-1-0-1.edge-b.backend.default.svc."+zone, dns.TypeA)
					if (host.Kind == KindEndpoint) == dropped {
						t.Errorf("endpoint name of the peer: %s (dropped: %t)", host.Kind, dropped)
					}
					srv := ix.Lookup("backend.default.svc."+zone, dns.TypeSRV)
					if n := len(want); (srv.SRV == nil && n > 0) || (srv.SRV != nil && len(srv.SRV.SRV) != n) {
						t.Errorf("SRV %v, want %d records", srvs(srv), n)
					}

					// In contact again: every endpoint is back.
					tb.SetStaleFor("edge-b", 0)
					if got := addrs(tb.Rebuild().Lookup("backend.default.svc."+zone, dns.TypeA)); !slices.Contains(got, "10.1.0.1") {
						t.Errorf("in contact again: %v, want the peer's endpoint back", got)
					}
				})
			}
		}
	}
}

// A change of the time out of contact that crosses no entry's grace renders
// nothing again: the index stays the same.
func TestStalePolicyRendersOnlyAtTheGrace(t *testing.T) {
	tb := newTable(cfg())
	e := export("backend", httpPort)
	e.StaleEndpoints, e.StaleGraceSeconds = annotation.StaleDrop, 30
	tb.Upsert(pod("edge-b", "default", "b1", "", true, []string{"10.1.0.1"}, e))
	tb.Upsert(pod("edge-c", "default", "c1", "", true, []string{"10.2.0.1"}, export("other", httpPort)))
	ix := tb.Rebuild()
	for _, step := range []struct {
		cluster string
		d       time.Duration
		renders bool
	}{
		{"edge-b", 10 * time.Second, false},
		{"edge-b", 30 * time.Second, false},
		{"edge-b", 31 * time.Second, true},
		{"edge-b", time.Hour, false},
		{"edge-c", time.Hour, false}, // no entry of edge-c drops
		{"edge-b", 0, true},
	} {
		n := tb.SetStaleFor(step.cluster, step.d)
		next := tb.Rebuild()
		if (n == 1) != step.renders || n > 1 {
			t.Errorf("%s out of contact for %s: %d services to render, want %t", step.cluster, step.d, n, step.renders)
		}
		if (next != ix) != step.renders {
			t.Errorf("%s out of contact for %s: a new index %t, want %t", step.cluster, step.d, next != ix, step.renders)
		}
		ix = next
	}
	// A record written while the cluster is out of contact brings its grace:
	// the next change that crosses it renders its service.
	late := export("late", httpPort)
	late.StaleEndpoints, late.StaleGraceSeconds = annotation.StaleDrop, 90
	tb.Upsert(pod("edge-b", "default", "l1", "", true, []string{"10.1.0.9"}, late))
	tb.Rebuild()
	for _, step := range []struct {
		d    time.Duration
		want int
	}{{60 * time.Second, 1}, {80 * time.Second, 0}, {100 * time.Second, 1}} {
		if n := tb.SetStaleFor("edge-b", step.d); n != step.want {
			t.Errorf("edge-b out of contact for %s: %d services to render, want %d", step.d, n, step.want)
		}
	}
	if k := tb.Rebuild().Lookup("late.default.svc."+zone, dns.TypeA).Kind; k != KindNXDomain {
		t.Errorf("late after its grace: %s, want nxdomain", k)
	}
}

// The matrix's third state: the consumer's expire has passed (the source
// drops every record of the cluster, as source.Expire does). Whatever the
// policy, with or without local endpoints, the cluster's endpoints are
// gone and the local ones stay; its next complete list brings them back,
// under its policy again (still out of contact past the grace: dropped
// where the policy says).
func TestStalePolicyExpired(t *testing.T) {
	const grace = 30 * time.Second
	for _, policy := range []string{annotation.StaleServe, annotation.StaleDrop, annotation.StaleDropIfLocal} {
		for _, local := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/local=%t", policy, local), func(t *testing.T) {
				c := cfg()
				c.Locality = Any
				tb := newTable(c)
				peer := export("backend", httpPort)
				peer.StaleEndpoints = policy
				if policy != annotation.StaleServe {
					peer.StaleGraceSeconds = int32(grace / time.Second)
				}
				b1 := pod("edge-b", "default", "b1", "", true, []string{"10.1.0.1"}, peer)
				tb.Upsert(b1)
				var want []string
				if local {
					tb.Upsert(pod("edge-a", "default", "a1", "", true, []string{"10.0.0.1"}, export("backend", httpPort)))
					want = []string{"10.0.0.1"}
				}
				tb.Rebuild()
				tb.SetStaleFor("edge-b", time.Hour)
				tb.ReplaceCluster("edge-b", nil) // expired
				ix := tb.Rebuild()
				got := addrs(ix.Lookup("backend.default.svc."+zone, dns.TypeA))
				if !slices.Equal(got, want) {
					t.Errorf("expired: service addresses %v, want %v", got, want)
				}
				if k := ix.Lookup("10-1-0-1.edge-b.backend.default.svc."+zone, dns.TypeA).Kind; k == KindEndpoint {
					t.Errorf("expired: the peer's endpoint name answers")
				}
				// A complete list while still out of contact (the API
				// server answered the list, not yet the contact check).
				tb.ReplaceCluster("edge-b", []*store.Pod{b1})
				got = addrs(tb.Rebuild().Lookup("backend.default.svc."+zone, dns.TypeA))
				dropped := policy == annotation.StaleDrop || (policy == annotation.StaleDropIfLocal && local)
				if slices.Contains(got, "10.1.0.1") == dropped {
					t.Errorf("listed again, still out of contact: %v (dropped by the policy: %t)", got, dropped)
				}
			})
		}
	}
}
