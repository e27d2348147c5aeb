package store

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/mcsannotations/mcsannotations/annotation"
)

func pod(cluster, ns, name string, ready bool, ip string, svcs ...string) *Pod {
	p := &Pod{Common: &Common{Cluster: cluster, Namespace: ns}, Name: name, Ready: ready}
	if ip != "" {
		p.IPs = []netip.Addr{netip.MustParseAddr(ip)}
	}
	for _, s := range svcs {
		p.Exports = append(p.Exports, annotation.Export{Name: s, Namespace: ns, Cluster: cluster})
	}
	return p
}

// mirror is a subscriber that applies the feed to a map of its own, checking
// each change against what it holds: a change's Old is the record it holds
// under that key (nil for none).
type mirror struct {
	t       testing.TB
	mu      sync.Mutex
	held    map[Key]*Pod
	batches int
}

func newMirror(t testing.TB) *mirror { return &mirror{t: t, held: map[Key]*Pod{}} }

func (m *mirror) apply(changes []Change) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches++
	for _, c := range changes {
		k := c.Key()
		if got := m.held[k]; got != c.Old {
			m.t.Errorf("%v: the change's old record is %+v, the subscriber holds %+v", k, c.Old, got)
		}
		if c.Old != nil && c.New != nil && c.Old.Equal(c.New) {
			m.t.Errorf("%v: an unchanged record reported as a change", k)
		}
		if c.New == nil {
			delete(m.held, k)
		} else {
			m.held[k] = c.New
		}
	}
}

// matches reports whether the mirror holds exactly the store's records (the
// same pointers).
func (m *mirror) matches(s *Store) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	pods := s.Pods("")
	if len(pods) != len(m.held) {
		return fmt.Errorf("the store holds %d records, the subscriber %d", len(pods), len(m.held))
	}
	for _, p := range pods {
		if m.held[p.Key()] != p {
			return fmt.Errorf("%v: the store holds %+v, the subscriber %+v", p.Key(), p, m.held[p.Key()])
		}
	}
	return nil
}

// op is one write of a test, and what the feed must say of it: each
// change as "+key" (new), "~key" (replaced) or "-key" (deleted), in order
// within a batch.
type op struct {
	upsert  *Pod
	del     *Key
	replace string // the cluster; pods are its records
	pods    []*Pod
	want    []string
}

func (o op) do(s *Store) {
	switch {
	case o.upsert != nil:
		s.Upsert(o.upsert)
	case o.del != nil:
		s.Delete(*o.del)
	default:
		s.ReplaceCluster(o.replace, o.pods)
	}
}

func describe(changes []Change) []string {
	var out []string
	for _, c := range changes {
		k := c.Key()
		sign := "~"
		switch {
		case c.Old == nil:
			sign = "+"
		case c.New == nil:
			sign = "-"
		}
		out = append(out, sign+k.Cluster+"/"+k.Namespace+"/"+k.Name)
	}
	return out
}

func TestWritesAndFeed(t *testing.T) {
	key := func(c, ns, n string) *Key { return &Key{c, ns, n} }
	cases := []struct {
		name string
		ops  []op
		len  map[string]int
	}{
		{name: "upsert new, changed, unchanged", ops: []op{
			{upsert: pod("a", "ns", "p", true, "10.0.0.1", "s"), want: []string{"+a/ns/p"}},
			{upsert: pod("a", "ns", "p", true, "10.0.0.2", "s"), want: []string{"~a/ns/p"}},
			{upsert: pod("a", "ns", "p", true, "10.0.0.2", "s")}, // equal: no change, no batch
		}, len: map[string]int{"a": 1}},
		{name: "delete, and delete unknown", ops: []op{
			{upsert: pod("a", "ns", "p", true, "10.0.0.1", "s"), want: []string{"+a/ns/p"}},
			{del: key("a", "ns", "nope")},
			{del: key("b", "ns", "p")},
			{del: key("a", "ns", "p"), want: []string{"-a/ns/p"}},
			{del: key("a", "ns", "p")},
		}, len: map[string]int{}},
		{name: "replace a cluster: deletions first, one batch, other clusters kept", ops: []op{
			{upsert: pod("a", "ns", "keep", true, "10.0.0.1", "s"), want: []string{"+a/ns/keep"}},
			{upsert: pod("a", "ns", "gone", true, "10.0.0.2", "s"), want: []string{"+a/ns/gone"}},
			{upsert: pod("a", "other", "gone2", true, "10.0.0.3", "s"), want: []string{"+a/other/gone2"}},
			{upsert: pod("b", "ns", "stays", true, "10.1.0.1", "s"), want: []string{"+b/ns/stays"}},
			{replace: "a", pods: []*Pod{
				pod("a", "ns", "keep", true, "10.0.0.1", "s"),   // unchanged: no change
				pod("a", "ns", "new", false, "", "s"),           // new
				pod("b", "ns", "stays", false, "10.9.9.9", "s"), // another cluster's: ignored
			}, want: []string{"-a/ns/gone", "-a/other/gone2", "+a/ns/new"}},
		}, len: map[string]int{"a": 2, "b": 1}},
		{name: "replace with a duplicate key: the later wins", ops: []op{
			{replace: "a", pods: []*Pod{pod("a", "ns", "p", true, "10.0.0.1", "s"), pod("a", "ns", "p", true, "10.0.0.2", "s")},
				want: []string{"+a/ns/p"}},
			{upsert: pod("a", "ns", "p", true, "10.0.0.2", "s")}, // what it holds: no change
		}, len: map[string]int{"a": 1}},
		{name: "replace with nothing empties the cluster", ops: []op{
			{upsert: pod("a", "ns", "p", true, "10.0.0.1", "s"), want: []string{"+a/ns/p"}},
			{replace: "a", want: []string{"-a/ns/p"}},
			{replace: "a"}, // nothing held, nothing given: no batch
		}, len: map[string]int{}},
		{name: "a record changed by a replace", ops: []op{
			{upsert: pod("a", "ns", "p", true, "10.0.0.1", "s"), want: []string{"+a/ns/p"}},
			{replace: "a", pods: []*Pod{pod("a", "ns", "p", true, "10.0.0.1", "s", "t")}, want: []string{"~a/ns/p"}},
		}, len: map[string]int{"a": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			m := newMirror(t)
			s.Subscribe(m.apply)
			var got [][]string
			s.Subscribe(func(changes []Change) { got = append(got, describe(changes)) })
			for i, o := range tc.ops {
				got = nil
				o.do(s)
				var want [][]string
				if o.want != nil {
					want = [][]string{o.want}
				}
				// Within the deletions and the upserts of a batch the order
				// is the store's: compare those sorted.
				for _, b := range got {
					sortRuns(b)
				}
				for _, b := range want {
					sortRuns(b)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("op %d: the feed said %v, want %v", i, got, want)
				}
				if err := m.matches(s); err != nil {
					t.Errorf("op %d: %v", i, err)
				}
			}
			if l := s.Len(); fmt.Sprint(l) != fmt.Sprint(tc.len) {
				t.Errorf("Len %v, want %v", l, tc.len)
			}
		})
	}
}

// sortRuns sorts the deletions of a described batch and the rest, each among
// themselves.
func sortRuns(b []string) {
	i := 0
	for i < len(b) && strings.HasPrefix(b[i], "-") {
		i++
	}
	slices.Sort(b[:i])
	slices.Sort(b[i:])
}

// An unchanged record keeps the pointer held, through Upsert and
// ReplaceCluster: readers that compare pointers (the MCS controller) see no
// change.
func TestUnchangedKeepsPointer(t *testing.T) {
	s := New()
	a := pod("a", "ns", "p", true, "10.0.0.1", "s")
	s.Upsert(a)
	s.Upsert(pod("a", "ns", "p", true, "10.0.0.1", "s"))
	s.ReplaceCluster("a", []*Pod{pod("a", "ns", "p", true, "10.0.0.1", "s")})
	if got := s.Pods("a"); len(got) != 1 || got[0] != a {
		t.Errorf("holds %v, want the first record", got)
	}
}

// A subscriber that comes late gets the records held as new ones, at once.
func TestLateSubscriber(t *testing.T) {
	s := New()
	s.Upsert(pod("a", "ns", "p", true, "10.0.0.1", "s"))
	s.ReplaceCluster("b", []*Pod{pod("b", "ns", "q", true, "10.1.0.1", "s"), pod("b", "x", "r", true, "10.1.0.2", "s")})
	m := newMirror(t)
	s.Subscribe(m.apply)
	if m.batches != 1 {
		t.Errorf("%d batches at subscription, want 1", m.batches)
	}
	if err := m.matches(s); err != nil {
		t.Error(err)
	}
	s.Delete(Key{"b", "x", "r"})
	if err := m.matches(s); err != nil {
		t.Error(err)
	}
	// An empty store calls nothing at subscription.
	calls := 0
	New().Subscribe(func([]Change) { calls++ })
	if calls != 0 {
		t.Errorf("an empty store called a new subscriber %d times", calls)
	}
}

// A subscriber is called with the records' lock released: it may read the
// store, and sees the write it is told about.
func TestSubscriberReads(t *testing.T) {
	s := New()
	var seen []int
	s.Subscribe(func([]Change) { seen = append(seen, s.Len()["a"]) })
	s.Upsert(pod("a", "ns", "p", true, "10.0.0.1", "s"))
	s.ReplaceCluster("a", []*Pod{pod("a", "ns", "p", true, "10.0.0.1", "s"), pod("a", "ns", "q", true, "10.0.0.2", "s")})
	s.Delete(Key{"a", "ns", "p"})
	if !slices.Equal(seen, []int{1, 2, 1}) {
		t.Errorf("the subscriber read %v, want [1 2 1]", seen)
	}
}

// Random writes against a model: the store holds the model's records, and a
// subscriber that mirrors the feed holds the same.
func TestRandomOpsMatchModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clusters, namespaces := []string{"a", "b"}, []string{"x", "y"}
	random := func(cluster string) *Pod {
		return pod(cluster, namespaces[rng.IntN(2)], fmt.Sprint("p", rng.IntN(6)), rng.IntN(4) != 0,
			fmt.Sprintf("10.0.0.%d", rng.IntN(3)), fmt.Sprint("s", rng.IntN(3)))
	}
	s := New()
	m := newMirror(t)
	s.Subscribe(m.apply)
	model := map[Key]*Pod{}
	for step := range 3000 {
		cluster := clusters[rng.IntN(2)]
		switch r := rng.IntN(10); {
		case r < 6:
			p := random(cluster)
			s.Upsert(p)
			model[p.Key()] = p
		case r < 8:
			p := random(cluster)
			s.Delete(p.Key())
			delete(model, p.Key())
		default:
			var pods []*Pod
			for range rng.IntN(8) {
				pods = append(pods, random(cluster))
			}
			pods = append(pods, random("other")) // ignored
			s.ReplaceCluster(cluster, pods)
			for k := range model {
				if k.Cluster == cluster {
					delete(model, k)
				}
			}
			for _, p := range pods {
				if p.Cluster == cluster {
					model[p.Key()] = p
				}
			}
		}
		got := s.Pods("")
		if len(got) != len(model) {
			t.Fatalf("step %d: %d records, model %d", step, len(got), len(model))
		}
		for _, p := range got {
			if !p.Equal(model[p.Key()]) {
				t.Fatalf("step %d: %v: store %+v, model %+v", step, p.Key(), p, model[p.Key()])
			}
		}
		if err := m.matches(s); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		n := 0
		for _, c := range s.Len() {
			n += c
		}
		for _, c := range clusters {
			if len(s.Pods(c)) != s.Len()[c] {
				t.Fatalf("step %d: cluster %s: Pods has %d, Len says %d", step, c, len(s.Pods(c)), s.Len()[c])
			}
		}
		if n != len(model) {
			t.Fatalf("step %d: Len counts %d, model %d", step, n, len(model))
		}
	}
}

// Writers of several clusters (as sources are) and readers at once, with a
// subscriber: after the writers stop, the subscriber holds exactly the
// store's records, and each change it got followed the one before (mirror
// checks Old). Run with -race.
func TestConcurrentWritersAndSubscriber(t *testing.T) {
	s := New()
	m := newMirror(t)
	s.Subscribe(m.apply)
	var wg sync.WaitGroup
	for w := range 4 {
		cluster := fmt.Sprint("c", w%2) // two writers per cluster
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 500 {
				p := pod(cluster, "ns", fmt.Sprint("p", rng.IntN(20)), i%3 != 0, fmt.Sprintf("10.0.%d.%d", w, rng.IntN(200)), "s")
				switch rng.IntN(10) {
				case 0:
					s.ReplaceCluster(cluster, []*Pod{p, pod(cluster, "ns", "fixed", true, "10.9.0.1", "s")})
				case 1, 2:
					s.Delete(p.Key())
				default:
					s.Upsert(p)
				}
			}
		})
	}
	wg.Go(func() { // a reader
		for range 200 {
			for _, p := range s.Pods("") {
				_ = p.Key()
			}
			_ = s.Len()
		}
	})
	// A second subscriber, added while the writers run, catches up.
	late := newMirror(t)
	s.Subscribe(late.apply)
	wg.Wait()
	for _, sub := range []*mirror{m, late} {
		if err := sub.matches(s); err != nil {
			t.Error(err)
		}
	}
}

// A record is what the store holds once per endpoint: keep it in the 80-byte
// size class (BenchmarkIndexHeap, in internal/snapshot, measures the heap it
// makes), its cluster, namespace and exports shared through Common.
func TestPodSize(t *testing.T) {
	if n := unsafe.Sizeof(Pod{}); n > 80 {
		t.Errorf("store.Pod is %d bytes, more than 80", n)
	}
}

func TestDashedIP(t *testing.T) {
	for in, want := range map[string]string{
		"10.244.0.5":      "10-244-0-5",
		"fd00::5":         "fd00--5",
		"::1":             "0--1",
		"fd00::":          "fd00--0",
		"::ffff:10.0.0.1": "10-0-0-1",
	} {
		if got := DashedIP(netip.MustParseAddr(in)); got != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
}

func TestEndpointHostname(t *testing.T) {
	for _, tc := range []struct {
		p    *Pod
		want string
	}{
		{&Pod{Hostname: "web-0", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}, "web-0"},
		{&Pod{IPs: []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.0.0.1")}}, "fd00--1"},
		{&Pod{}, ""},
	} {
		if got := tc.p.EndpointHostname(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.p, got, tc.want)
		}
	}
}

// Get returns the record held under a key, the very one written (or kept
// by a ReplaceCluster that found it unchanged), and nil for a key of an
// unknown cluster, namespace or name.
func TestGet(t *testing.T) {
	s := New()
	a, b := pod("c1", "ns", "a", true, "10.0.0.1", "svc"), pod("c1", "ns", "b", true, "10.0.0.2", "svc")
	s.ReplaceCluster("c1", []*Pod{a, b})
	s.ReplaceCluster("c1", []*Pod{pod("c1", "ns", "a", true, "10.0.0.1", "svc"), b})
	for _, c := range []struct {
		key  Key
		want *Pod
	}{
		{Key{"c1", "ns", "a"}, a},
		{Key{"c1", "ns", "b"}, b},
		{Key{"c1", "ns", "z"}, nil},
		{Key{"c1", "other", "a"}, nil},
		{Key{"c2", "ns", "a"}, nil},
	} {
		if got := s.Get(c.key); got != c.want {
			t.Errorf("Get(%v) = %p, want %p", c.key, got, c.want)
		}
	}
}
