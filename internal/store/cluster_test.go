package store

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func nsPod(cluster, ns, name string, ready bool) *Pod {
	return &Pod{Common: &Common{Cluster: cluster, Namespace: ns}, Name: name, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ready: ready}
}

func names(ps []*Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	slices.Sort(out)
	return out
}

// A cluster's records are found through its own namespaces, whichever
// write made or emptied them: Pods and ReplaceCluster see every group of
// the cluster and none of another's.
func TestClusterNamespaces(t *testing.T) {
	s := New()
	var changes []Change
	s.Subscribe(func(cs []Change) { changes = append(changes[:0], cs...) })
	s.Upsert(nsPod("a", "ns-1", "p", true))
	s.Upsert(nsPod("a", "ns-2", "q", true))
	s.Upsert(nsPod("b", "ns-1", "p", true))
	s.Delete(Key{"a", "ns-1", "p"}) // ns-1 of a empties
	s.Upsert(nsPod("a", "ns-3", "r", true))
	if got := names(s.Pods("a")); !slices.Equal(got, []string{"ns-2/q", "ns-3/r"}) {
		t.Fatalf("Pods(a) = %q", got)
	}
	// Replacing a's records deletes those of its namespaces the new set lacks.
	s.ReplaceCluster("a", []*Pod{nsPod("a", "ns-1", "s", true), nsPod("a", "ns-2", "q", true)})
	if got := names(s.Pods("a")); !slices.Equal(got, []string{"ns-1/s", "ns-2/q"}) {
		t.Fatalf("Pods(a) after ReplaceCluster = %q", got)
	}
	var got []string
	for _, c := range changes {
		got = append(got, fmt.Sprintf("%v->%v", c.Old != nil, c.New != nil))
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"false->true", "true->false"}) {
		t.Errorf("changes %q, want ns-3/r deleted and ns-1/s added", got)
	}
	s.ReplaceCluster("a", nil)
	if got := s.Pods("a"); len(got) != 0 {
		t.Errorf("Pods(a) after replacing with nothing = %q", names(got))
	}
	if got := names(s.Pods("b")); !slices.Equal(got, []string{"ns-1/p"}) {
		t.Errorf("Pods(b) = %q: another cluster's writes changed it", got)
	}
	if n := len(s.nss); n != 1 {
		t.Errorf("namespaces kept for %d clusters, want 1 (b)", n)
	}
}

// One origin's records replaced among a thousand clusters' (a reader of
// hubs at each change of an origin).
func BenchmarkReplaceClusterAmongMany(b *testing.B) {
	s := New()
	var one []*Pod
	for c := range 1000 {
		cluster := fmt.Sprintf("o%04d", c)
		var ps []*Pod
		for i := range 30 {
			ps = append(ps, nsPod(cluster, fmt.Sprintf("ns-%d", i%2), fmt.Sprintf("p-%d", i), true))
		}
		s.ReplaceCluster(cluster, ps)
		if c == 500 {
			one = ps
		}
	}
	b.ResetTimer()
	for n := 0; b.Loop(); n++ {
		ps := slices.Clone(one)
		ps[0] = nsPod("o0500", "ns-0", "p-0", n%2 == 0)
		s.ReplaceCluster("o0500", ps)
	}
}
