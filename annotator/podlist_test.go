package annotator

import (
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// podList reads the heartbeat Lease and returns its heartbeat's time and
// its Pod list, which must verify with pub and be of the heartbeat's time.
func (f *fixture) podList(pub ed25519.PublicKey) (annotation.PodSet, error) {
	at, err := f.heartbeat(pub, "edge-a")
	if err != nil {
		return annotation.PodSet{}, err
	}
	l, err := f.client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(f.t.Context(), annotation.HeartbeatLeaseName, metav1.GetOptions{})
	if err != nil {
		return annotation.PodSet{}, err
	}
	pl, set, rej, ok := annotation.VerifyPodList(pub, l.Annotations[annotation.PodListSignatureAnnotation], "edge-a", l.Annotations[annotation.PodListAnnotation])
	switch {
	case !ok:
		return set, fmt.Errorf("Pod list %.100q: %v", l.Annotations[annotation.PodListAnnotation], rej)
	case pl.Time != at:
		return set, fmt.Errorf("Pod list of %d with a heartbeat of %d", pl.Time, at)
	}
	ul, uset, rej, ok := annotation.VerifyPodUIDList(pub, l.Annotations[annotation.PodUIDListSignatureAnnotation], "edge-a", l.Annotations[annotation.PodUIDListAnnotation])
	switch {
	case !ok:
		return set, fmt.Errorf("Pod list by UID %.100q: %v", l.Annotations[annotation.PodUIDListAnnotation], rej)
	case ul.Time != at:
		return set, fmt.Errorf("Pod list by UID of %d with a heartbeat of %d", ul.Time, at)
	case uset.Len() != set.Len() || uset.Over() != set.Over():
		return set, fmt.Errorf("Pod list by UID of %d Pods (over: %v), by name of %d (over: %v)", uset.Len(), uset.Over(), set.Len(), set.Over())
	}
	return set, nil
}

// With each heartbeat the annotator writes the signed list of the Pods it
// states endpoints for, of the heartbeat's time: the exported Pods, not the
// others; a deleted Pod leaves the next list.
func TestHeartbeatPodList(t *testing.T) {
	pub, cfg := endpointKey(t)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	other := readyPod("other", true, "10.0.0.9")
	other.Labels = map[string]string{"app": "frontend"}
	f := startWith(t, cfg, false, []runtime.Object{svc("backend", app), readyPod("p", true, "10.0.0.1"), readyPod("q", true, "10.0.0.2"), other})
	has := func(set annotation.PodSet, want map[string]bool) error {
		for name, in := range want {
			if set.Has("ns", name) != in {
				return fmt.Errorf("list of %d Pods names %s: %v, want %v", set.Len(), name, !in, in)
			}
		}
		return nil
	}
	f.eventually("a list of p and q", func() error {
		set, err := f.podList(pub)
		if err == nil {
			err = has(set, map[string]bool{"p": true, "q": true, "other": false})
		}
		return err
	})
	if err := f.client.CoreV1().Pods("ns").Delete(t.Context(), "q", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("a list without q", func() error {
		set, err := f.podList(pub)
		if err == nil {
			err = has(set, map[string]bool{"p": true, "q": false, "other": false})
		}
		return err
	})
}

// podLister: a list names the Pods stated before it while the cache holds
// them, and those the cache holds with a statement; the list by UID names
// the same Pods by their UIDs, but not a stated Pod whose name the cache
// holds under another UID (deleted and made again). A statement signed
// after a list is not older than it.
func TestPodLister(t *testing.T) {
	mkUID := func(name, uid string, statement bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}}
		if statement {
			p.Annotations = map[string]string{annotation.EndpointAnnotation: `{"seq":1}`}
		}
		return p
	}
	mk := func(name string, statement bool) *corev1.Pod { return mkUID(name, "uid-"+name, statement) }
	again := func(name string, statement bool) *corev1.Pod { return mkUID(name, "uid-"+name+"-again", statement) }
	type pod struct{ name, uid string }
	for _, tc := range []struct {
		name            string
		cached          []*corev1.Pod // the informer's cache at the list
		before          []*corev1.Pod // stated before the list (not in the cache with a statement yet)
		want            []string      // named
		notWanted       []string
		wantUID, notUID []pod // named by UID, or not
		stillStated     []string
		forgotten       []string
	}{
		{name: "carrying a statement", cached: []*corev1.Pod{mk("a", true), mk("b", false)}, want: []string{"a"}, notWanted: []string{"b"},
			wantUID: []pod{{"a", "uid-a"}}, notUID: []pod{{"b", "uid-b"}}},
		{name: "stated, not cached with it yet", cached: []*corev1.Pod{mk("a", false)}, before: []*corev1.Pod{mk("a", false)}, want: []string{"a"},
			wantUID: []pod{{"a", "uid-a"}}, stillStated: []string{"a"}},
		{name: "stated, then deleted", cached: []*corev1.Pod{mk("b", true)}, before: []*corev1.Pod{mk("a", false)}, want: []string{"b"}, notWanted: []string{"a"},
			wantUID: []pod{{"b", "uid-b"}}, notUID: []pod{{"a", "uid-a"}}, forgotten: []string{"a"}},
		{name: "stated, then made again without a statement", cached: []*corev1.Pod{again("a", false)}, before: []*corev1.Pod{mk("a", false)}, want: []string{"a"},
			notUID: []pod{{"a", "uid-a"}, {"a", "uid-a-again"}}, forgotten: []string{"a"}},
		{name: "stated, then made again with one", cached: []*corev1.Pod{again("a", true)}, before: []*corev1.Pod{mk("a", false)}, want: []string{"a"},
			wantUID: []pod{{"a", "uid-a-again"}}, notUID: []pod{{"a", "uid-a"}}, forgotten: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			for _, p := range tc.cached {
				if err := idx.Add(p); err != nil {
					t.Fatal(err)
				}
			}
			var p podLister
			for _, n := range tc.before {
				if seq := p.stated(n, 5); seq != 5 {
					t.Errorf("seq %d before any list, want 5", seq)
				}
			}
			const at = 1790000000000
			names, uids := p.list(corelisters.NewPodLister(idx), at)
			pl, ok := annotation.NewPodList("edge-a", at, names)
			ul, uok := annotation.NewPodList("edge-a", at, uids)
			if !ok || !uok {
				t.Fatal("no list")
			}
			_, set, err := annotation.ParsePodList(annotation.FormatPodList(pl))
			if err != nil {
				t.Fatal(err)
			}
			_, uset, err := annotation.ParsePodList(annotation.FormatPodList(ul))
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range tc.want {
				if !set.Has("ns", n) {
					t.Errorf("list does not name %s", n)
				}
			}
			for _, n := range tc.notWanted {
				if set.Has("ns", n) {
					t.Errorf("list names %s", n)
				}
			}
			for _, n := range tc.wantUID {
				if !uset.HasHash(annotation.PodUIDHash("ns", n.name, n.uid)) {
					t.Errorf("list by UID does not name %s of %s", n.name, n.uid)
				}
			}
			for _, n := range tc.notUID {
				if uset.HasHash(annotation.PodUIDHash("ns", n.name, n.uid)) {
					t.Errorf("list by UID names %s of %s", n.name, n.uid)
				}
			}
			for _, n := range tc.stillStated {
				if _, ok := p.names["ns/"+n]; !ok {
					t.Errorf("%s forgotten", n)
				}
			}
			for _, n := range tc.forgotten {
				if _, ok := p.names["ns/"+n]; ok {
					t.Errorf("%s still noted as stated", n)
				}
			}
			// After the list: a new statement is not older than it, one
			// already later stays as it is; a kept one (0) is noted only.
			for _, c := range [][2]uint64{{5, at}, {at + 7, at + 7}, {0, 0}} {
				if got := p.stated(mk("z", false), c[0]); got != c[1] {
					t.Errorf("stated with seq %d after the list: %d, want %d", c[0], got, c[1])
				}
			}
		})
	}
}

// An origin with more Pods than a list may name writes, with its
// heartbeat, a signed list that names none and says how many it has
// (readers then drop nothing on its word, yet see that lists are still
// written), and one naming them again once it has fewer.
func TestHeartbeatPodListBound(t *testing.T) {
	pub, cfg := endpointKey(t)
	for _, tc := range []struct {
		name string
		pods int
		over bool
	}{
		{"at the bound", annotation.MaxPodListPods, false},
		{"over the bound", annotation.MaxPodListPods + 1, true},
		{"none", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			for i := range tc.pods {
				if err := idx.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p-%d", i),
					Annotations: map[string]string{annotation.EndpointAnnotation: `{"seq":1}`}}}); err != nil {
					t.Fatal(err)
				}
			}
			client := fake.NewClientset()
			c := &Controller{client: client, cfg: cfg, pods: corelisters.NewPodLister(idx)}
			at, err := c.writeHeartbeat(t.Context(), 0)
			if err != nil {
				t.Fatal(err)
			}
			l, err := client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(t.Context(), annotation.HeartbeatLeaseName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, ok := annotation.VerifyHeartbeat(pub, l.Annotations[annotation.HeartbeatSignatureAnnotation], "edge-a", l.Annotations[annotation.HeartbeatAnnotation]); !ok {
				t.Error("no heartbeat")
			}
			pl, set, _, ok := annotation.VerifyPodList(pub, l.Annotations[annotation.PodListSignatureAnnotation], "edge-a", l.Annotations[annotation.PodListAnnotation])
			switch {
			case !ok || pl.Time != at:
				t.Errorf("a list that verifies: %v, at %d (heartbeat %d)", ok, pl.Time, at)
			case set.Over() != tc.over:
				t.Errorf("a list over the bound: %v, want %v", set.Over(), tc.over)
			case tc.over && (set.Len() != 0 || pl.Over != tc.pods):
				t.Errorf("over the bound, a list naming %d Pods, saying %d, want none, saying %d", set.Len(), pl.Over, tc.pods)
			case !tc.over && set.Len() != tc.pods:
				t.Errorf("a list of %d Pods, want %d", set.Len(), tc.pods)
			}
			ul, uset, _, ok := annotation.VerifyPodUIDList(pub, l.Annotations[annotation.PodUIDListSignatureAnnotation], "edge-a", l.Annotations[annotation.PodUIDListAnnotation])
			if !ok || ul.Time != at || uset.Over() != tc.over || uset.Len() != set.Len() || ul.Over != pl.Over {
				t.Errorf("list by UID: verifies %v, at %d, over %v (%d), %d Pods; want as the list by name", ok, ul.Time, uset.Over(), ul.Over, uset.Len())
			}
		})
	}
}

// A new leader takes the heartbeat the Lease carries, when its key signed
// it, as the least seq of the statements it signs: the last leader's list
// may be of a clock ahead of its own. One its key did not sign is ignored.
func TestSeedListFloor(t *testing.T) {
	_, otherKey, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().Add(time.Hour).UnixMilli()
	for _, tc := range []struct {
		name   string
		own    bool
		raised bool
	}{
		{"own heartbeat ahead", true, true},
		{"another key's heartbeat", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, cfg := endpointKey(t)
			key := cfg.SignKey
			if !tc.own {
				key = otherKey
			}
			hb := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: "edge-a", Time: ahead})
			l := heartbeatLeaseOf(hb, annotation.SignHeartbeat(key, "edge-a", hb))
			cfg.HeartbeatInterval = time.Hour
			f := startWith(t, cfg, false, []runtime.Object{svc("backend", app), readyPod("p", true, "10.0.0.1"), l})
			var e annotation.Endpoint
			f.eventually("stated", func() (err error) {
				e, err = f.stated("p", pub, true, 0, "10.0.0.1")
				return err
			})
			if got := e.Seq >= uint64(ahead); got != tc.raised {
				t.Errorf("seq %d, at least the heartbeat's %d: %v, want %v", e.Seq, ahead, got, tc.raised)
			}
		})
	}
}

// heartbeatLeaseOf is the heartbeat Lease carrying heartbeat hb and its
// signature sig.
func heartbeatLeaseOf(hb, sig string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: annotation.HeartbeatLeaseNamespace, Name: annotation.HeartbeatLeaseName,
		Annotations: map[string]string{annotation.HeartbeatAnnotation: hb, annotation.HeartbeatSignatureAnnotation: sig}}}
}
