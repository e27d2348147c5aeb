package source

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// podIn is an exporter of backend in namespace ns.
func podIn(ns, name, ip string) *v1.Pod {
	p := newPod(name, ip, backend, true)
	p.Namespace = ns
	p.UID = types.UID("uid-" + ns + "-" + name)
	return p
}

func listOf(namespaces ...string) *v1.ConfigMap {
	return &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ExportingNamespacesNamespace, Name: ExportingNamespacesName},
		Data:       map[string]string{ExportingNamespacesKey: FormatNamespaces(namespaces)},
	}
}

// scopes records the Scope events.
type scopes struct {
	mu  sync.Mutex
	all []Scope
}

func (s *scopes) add(_ string, sc Scope) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, sc)
}

func (s *scopes) last() Scope {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return Scope{Why: "none yet"}
	}
	return s.all[len(s.all)-1]
}

// answers is what backend.<ns> answers for each namespace.
func answers(tb testTable, namespaces ...string) map[string][]string {
	out := map[string][]string{}
	for _, ns := range namespaces {
		if a := answer(tb, "backend."+ns+".svc."); a != nil {
			out[ns] = a
		}
	}
	return out
}

func sameAnswers(got, want map[string][]string) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			return false
		}
	}
	return true
}

// podsReads returns the namespaces that Pods were listed or watched in
// ("" for all).
func podsReads(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "pods" && (a.GetVerb() == "list" || a.GetVerb() == "watch") {
			out = append(out, a.GetNamespace())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// A scoped source reads the Pods of the listed namespaces only, one watch
// each, and follows the list: a namespace that leaves it loses its records,
// one that joins is read; without the list it reads cluster-wide.
func TestScopedFollowsList(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(podIn("a", "p", "10.0.1.1"), podIn("b", "p", "10.0.2.1"), podIn("c", "p", "10.0.3.1"),
		listOf("a", "b"))
	tb := newTable()
	// A record of c from a snapshot: c does not export any more.
	tb.Upsert(&store.Pod{Common: &store.Common{Cluster: "edge-b", Namespace: "c", Exports: []annotation.Export{{Name: "backend", Namespace: "c", Cluster: "edge-b"}}}, Name: "old", Ready: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.0.3.9")}})
	var sc scopes
	s := New("edge-b", client, tb.Store, Events{Scope: sc.add}, Options{Scoped: true})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "first sync", s.HasSynced)
	want := map[string][]string{"a": {"10.0.1.1"}, "b": {"10.0.2.1"}}
	if got := answers(tb, "a", "b", "c"); !sameAnswers(got, want) {
		t.Fatalf("after sync: %v, want %v", got, want)
	}
	if got := sc.last(); got.ClusterWide || !slices.Equal(got.Namespaces, []string{"a", "b"}) {
		t.Errorf("scope %+v, want namespaces a and b", got)
	}
	if got := podsReads(client); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Pods read in namespaces %q, want a and b only", got)
	}

	// a stops exporting, c starts.
	cms := client.CoreV1().ConfigMaps(ExportingNamespacesNamespace)
	if _, err := cms.Update(ctx, listOf("b", "c"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = map[string][]string{"b": {"10.0.2.1"}, "c": {"10.0.3.1"}}
	eventually(t, "a gone, c read", func() bool { return sameAnswers(answers(tb, "a", "b", "c"), want) })
	if got := sc.last(); !slices.Equal(got.Namespaces, []string{"b", "c"}) {
		t.Errorf("scope %+v, want namespaces b and c", got)
	}
	// A Pod of a, no longer read, changes nothing.
	if _, err := client.CoreV1().Pods("a").Create(ctx, podIn("a", "q", "10.0.1.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The list goes (an exporter downgraded): every namespace is read.
	if err := cms.Delete(ctx, ExportingNamespacesName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want = map[string][]string{"a": {"10.0.1.1", "10.0.1.2"}, "b": {"10.0.2.1"}, "c": {"10.0.3.1"}}
	eventually(t, "cluster-wide", func() bool { return sameAnswers(answers(tb, "a", "b", "c"), want) })
	if got := sc.last(); !got.ClusterWide || got.Why != WhyNoList {
		t.Errorf("scope %+v, want cluster-wide: %s", got, WhyNoList)
	}
	// And back to the list.
	if _, err := cms.Create(ctx, listOf("c"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = map[string][]string{"c": {"10.0.3.1"}}
	eventually(t, "scoped again", func() bool { return sameAnswers(answers(tb, "a", "b", "c"), want) })
}

// An empty list: the cluster exports nothing, and the source is synced.
func TestScopedEmptyList(t *testing.T) {
	client := fake.NewClientset(podIn("a", "p", "10.0.1.1"), listOf())
	s, tb := startScoped(t, client, Options{Scoped: true})
	eventually(t, "first sync", s.HasSynced)
	if got := answers(tb, "a"); len(got) != 0 {
		t.Errorf("answers %v, want none", got)
	}
	if got := podsReads(client); len(got) != 0 {
		t.Errorf("Pods read in %q, want nowhere", got)
	}
}

func startScoped(t *testing.T, client *fake.Clientset, opts Options) (*Source, testTable) {
	t.Helper()
	tb := newTable()
	s := New("edge-b", client, tb.Store, Events{}, opts)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s, tb
}

// A namespace that joins keeps the records the store holds of it until its
// own list arrives: a switch never empties an answer on the way.
func TestScopedKeepsUnlistedNamespace(t *testing.T) {
	client := fake.NewClientset(podIn("a", "p", "10.0.1.1"), podIn("b", "p", "10.0.2.1"), listOf("a", "b"))
	var held atomic.Bool // b's list fails (the fake cannot block one call alone)
	held.Store(true)
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "b" && held.Load() {
			return true, nil, apierrors.NewServiceUnavailable("held")
		}
		return false, nil, nil
	})
	tb := newTable()
	// b's record from a snapshot, not what b's list will hold.
	tb.Upsert(&store.Pod{Common: &store.Common{Cluster: "edge-b", Namespace: "b", Exports: []annotation.Export{{Name: "backend", Namespace: "b", Cluster: "edge-b"}}}, Name: "old", Ready: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.0.2.9")}})
	s := New("edge-b", client, tb.Store, Events{}, Options{Scoped: true})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "a listed", func() bool { return slices.Equal(answer(tb, "backend.a.svc."), []string{"10.0.1.1"}) })
	if got := answer(tb, "backend.b.svc."); !slices.Equal(got, []string{"10.0.2.9"}) {
		t.Errorf("b before its list: %v, want the snapshot's 10.0.2.9", got)
	}
	if s.HasSynced() {
		t.Error("synced before every namespace listed")
	}
	held.Store(false)
	eventually(t, "b listed", func() bool { return slices.Equal(answer(tb, "backend.b.svc."), []string{"10.0.2.1"}) })
	eventually(t, "synced", s.HasSynced)
}

// A credential that may not read the list (one made before it) reads
// cluster-wide, does not count the refusal as a lost contact, and tries the
// list again every RecheckList.
func TestScopedForbiddenList(t *testing.T) {
	client := fake.NewClientset(podIn("a", "p", "10.0.1.1"), podIn("b", "p", "10.0.2.1"), listOf("a"))
	var forbidden atomic.Bool
	forbidden.Store(true)
	client.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if forbidden.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, ExportingNamespacesName, nil)
		}
		return false, nil, nil
	})
	var sc scopes
	var lost atomic.Int64
	tb := newTable()
	s := New("edge-b", client, tb.Store, Events{Scope: sc.add, StateChanged: func(_ string, _, to State, _ error) {
		if to == Disconnected {
			lost.Add(1)
		}
	}}, Options{Scoped: true, RecheckList: 100 * time.Millisecond})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	want := map[string][]string{"a": {"10.0.1.1"}, "b": {"10.0.2.1"}}
	eventually(t, "cluster-wide", func() bool { return sameAnswers(answers(tb, "a", "b"), want) })
	if got := sc.last(); !got.ClusterWide || got.Why != WhyForbidden {
		t.Errorf("scope %+v, want cluster-wide: %s", got, WhyForbidden)
	}
	if n := lost.Load(); n != 0 {
		t.Errorf("%d transitions to disconnected for a refused list", n)
	}
	forbidden.Store(false)
	want = map[string][]string{"a": {"10.0.1.1"}}
	eventually(t, "scoped once the list may be read", func() bool { return sameAnswers(answers(tb, "a", "b"), want) })
}

// More namespaces than MaxNamespaces: one cluster-wide watch, not one each.
func TestScopedTooMany(t *testing.T) {
	client := fake.NewClientset(podIn("a", "p", "10.0.1.1"), listOf("a", "b", "c"))
	s, tb := startScoped(t, client, Options{Scoped: true, MaxNamespaces: 2})
	eventually(t, "first sync", s.HasSynced)
	if got := answer(tb, "backend.a.svc."); !slices.Equal(got, []string{"10.0.1.1"}) {
		t.Errorf("answer %v", got)
	}
	if got := podsReads(client); !slices.Equal(got, []string{""}) {
		t.Errorf("Pods read in %q, want cluster-wide only", got)
	}
}

func TestParseNamespaces(t *testing.T) {
	for _, tc := range []struct {
		in            string
		want, ignored []string
	}{
		{"", nil, nil},
		{"b\na\n", []string{"a", "b"}, nil},
		{" a \r\n\na\nb", []string{"a", "b"}, nil},
		{"a\nNot_A_Name\n../x\n", []string{"a"}, []string{"Not_A_Name", "../x"}},
	} {
		got, ign := ParseNamespaces(tc.in)
		if !slices.Equal(got, tc.want) || !slices.Equal(ign, tc.ignored) {
			t.Errorf("ParseNamespaces(%q) = %q, %q; want %q, %q", tc.in, got, ign, tc.want, tc.ignored)
		}
	}
	if got := FormatNamespaces([]string{"b", "a", "b"}); got != "a\nb\n" {
		t.Errorf("FormatNamespaces = %q", got)
	}
	var many []byte
	for range 100 {
		many = append(many, "X\n"...)
	}
	if _, ign := ParseNamespaces(string(many)); len(ign) != maxIgnored {
		t.Errorf("%d ignored kept, want at most %d", len(ign), maxIgnored)
	}
}
