package mcscontroller

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

const hubNS = "hub-system"

// relayed are the records of n Pods of cluster b exporting web, each with a
// proof: the even ones with a statement signed by key, the odd ones
// without (their origin does not state endpoints). export gives each Pod's
// raw export annotation.
func relayed(n int, key ed25519.PrivateKey, export func(i int) string) []*store.Pod {
	var out []*store.Pod
	for i := range n {
		p := exporter("b", "web", fmt.Sprintf("10.1.0.%d", i+1), annotation.TypeHeadless)
		p.Name = fmt.Sprintf("web-b-%02d", i)
		p.Proof = &store.Proof{UID: "uid-" + p.Name, Export: export(i)}
		if i%2 == 0 {
			stmt := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{p.IPs[0].String()}, Ready: true, Seq: 7})
			p.Proof.Endpoint = stmt
			p.Proof.EndpointSignature = annotation.SignEndpoint(key, "b", "ns", p.Name, p.Proof.UID, p.Proof.Export, stmt)
		}
		out = append(out, p)
	}
	return out
}

// relayOf parses a slice's relay annotation.
func relayOf(t *testing.T, s discoveryv1.EndpointSlice) relay.Slice {
	t.Helper()
	raw, ok := s.Annotations[relay.SliceAnnotation]
	if !ok {
		t.Fatalf("slice %s: no relay annotation", s.Name)
	}
	rs, err := relay.Parse(raw)
	if err != nil {
		t.Fatalf("slice %s: %v", s.Name, err)
	}
	return rs
}

// A hub's slices carry, beside their standard fields, the records behind
// their endpoints: the origin's signed statements (which verify with its
// key), unsigned statements from the records for the others, the export
// bytes once; at most RelayEndpointsPerSlice endpoints a slice. Without
// Relay, neither.
func TestRelayAnnotations(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	const raw = `{"services":[{"name":"web","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("relay=%v", on), func(t *testing.T) {
			e := newEnv(t, Config{Relay: on, RelayNamespace: hubNS}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())})
			recs := relayed(45, key, func(int) string { return strings.Clone(raw) })
			for _, p := range recs {
				e.table.Upsert(p)
			}
			e.start(false)
			e.waitSynced()
			if err := e.reconcile(); err != nil {
				t.Fatal(err)
			}
			var sizes []int
			seen := map[string]bool{}
			for _, s := range e.slices() {
				sizes = append(sizes, len(s.Endpoints))
				if !on {
					if _, ok := s.Annotations[relay.SliceAnnotation]; ok {
						t.Errorf("slice %s has a relay annotation without Relay", s.Name)
					}
					continue
				}
				rs := relayOf(t, s)
				if len(rs.Exports) != 1 || rs.Exports[0] != raw {
					t.Errorf("slice %s: exports %q, want the one raw annotation", s.Name, rs.Exports)
				}
				var addrs, stated []string
				for _, ep := range s.Endpoints {
					addrs = append(addrs, ep.Addresses...)
				}
				for _, p := range rs.Pods {
					seen[p.Name] = true
					ep, ips, err := annotation.ParseEndpoint(p.Endpoint)
					if err != nil || len(ips) != 1 || !ep.Ready {
						t.Fatalf("pod %s: statement %q: %v", p.Name, p.Endpoint, err)
					}
					stated = append(stated, ips[0].String())
					_, ok := annotation.VerifyEndpoint(pub, p.Signature, s.Labels[mcsv1beta1.LabelSourceCluster], s.Namespace, p.Name, p.UID, rs.Exports[p.Export], p.Endpoint)
					var i int
					fmt.Sscanf(p.Name, "web-b-%d", &i)
					if signed := i%2 == 0; ok != signed || p.UID != "uid-"+p.Name || signed != (ep.Seq == 7) {
						t.Errorf("pod %s: verifies %v, seq %d, uid %s", p.Name, ok, ep.Seq, p.UID)
					}
				}
				slices.Sort(addrs)
				slices.Sort(stated)
				if !slices.Equal(addrs, stated) {
					t.Errorf("slice %s: endpoints %v, relayed statements of %v", s.Name, addrs, stated)
				}
			}
			slices.Sort(sizes)
			want := []int{45}
			if on {
				want = []int{5, 20, 20}
				if len(seen) != 45 {
					t.Errorf("%d Pods relayed, want 45", len(seen))
				}
			}
			if !slices.Equal(sizes, want) {
				t.Errorf("slices of %v endpoints, want %v", sizes, want)
			}
		})
	}
}

// A share whose relayed bytes would not fit in slices of
// RelayEndpointsPerSlice is split into smaller slices, never dropped: each
// annotation within relay.MaxSliceBytes, every Pod relayed once.
func TestRelaySplitsLargeSlices(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())})
	// Each Pod a distinct export of 20 KB (a rollout in progress): twenty
	// of them are 400 KB.
	for _, p := range relayed(20, key, func(i int) string {
		return fmt.Sprintf(`{"services":[{"name":"web"}],"pad%d":"%s"}`, i, strings.Repeat("x", 20<<10))
	}) {
		e.table.Upsert(p)
	}
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	n := 0
	for _, s := range e.slices() {
		n++
		if v := s.Annotations[relay.SliceAnnotation]; len(v) > relay.MaxSliceBytes {
			t.Errorf("slice %s: relay annotation of %d bytes", s.Name, len(v))
		}
		rs := relayOf(t, s)
		if len(rs.Pods) != len(s.Endpoints) {
			t.Errorf("slice %s: %d endpoints, %d relayed", s.Name, len(s.Endpoints), len(rs.Pods))
		}
		for _, p := range rs.Pods {
			seen[p.Name]++
		}
	}
	if len(seen) != 20 || n < 3 {
		t.Errorf("%d Pods relayed in %d slices, want 20 in 3 or more", len(seen), n)
	}
	for name, c := range seen {
		if c != 1 {
			t.Errorf("%s relayed %d times", name, c)
		}
	}
}

// A hub keeps one Lease per source cluster, the local one included: holder
// the hub's cluster ID, the source's state and last contact, written at the
// start and when the state changes, not on every look.
func TestRelayLeases(t *testing.T) {
	contact := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	a, b := newSource("a", true, time.Now()), newSource("b", true, contact)
	e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond}, []*fakeSource{a, b})
	lease := func(cluster string) *coordinationv1.Lease {
		l, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+cluster, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return l
	}
	leaseWrites := func() int {
		n := 0
		for _, w := range e.writes() {
			if strings.HasSuffix(strings.TrimSpace(w), "leases") {
				n++
			}
		}
		return n
	}
	e.start(true)
	e.poll("the Leases", func() bool { return lease("a") != nil && lease("b") != nil })
	for _, cl := range []string{"a", "b"} {
		l := lease(cl)
		if l.Labels[relay.OriginLabel] != cl || l.Annotations[relay.OriginStateAnnotation] != "connected" ||
			l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "a" || l.Spec.RenewTime == nil {
			t.Errorf("Lease of %s: %+v %+v", cl, l.ObjectMeta, l.Spec)
		}
	}
	if got := lease("b").Spec.RenewTime.Time; !got.Equal(contact) {
		t.Errorf("Lease of b: renewTime %v, want its last contact %v", got, contact)
	}
	// Contact goes on: nothing written.
	before := leaseWrites()
	for range 5 {
		a.setLast(time.Now())
		time.Sleep(10 * time.Millisecond)
	}
	if n := leaseWrites(); n != before {
		t.Errorf("%d Lease writes while no state changed", n-before)
	}
	// b is cut: its Lease says so, with its last contact.
	lost := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	b.setLast(lost)
	b.cut.Store(true)
	e.poll("b's Lease to say disconnected", func() bool {
		l := lease("b")
		return l != nil && l.Annotations[relay.OriginStateAnnotation] == source.Disconnected.String()
	})
	if got := lease("b").Spec.RenewTime.Time; !got.Equal(lost) {
		t.Errorf("Lease of b: renewTime %v, want %v", got, lost)
	}
	if l := lease("a"); l.Annotations[relay.OriginStateAnnotation] != "connected" {
		t.Errorf("Lease of a: %v", l.Annotations)
	}
}

// After a restart, a cluster not heard from yet keeps the renewTime its
// Lease had: the hub's last contact before the restart, not none.
func TestRelayLeaseKeepsLastContact(t *testing.T) {
	before := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	old := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: hubNS, Name: relay.LeasePrefix + "b"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: before}}}
	b := newSource("b", false, time.Time{})
	b.cut.Store(true)
	e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond}, []*fakeSource{newSource("a", true, time.Now()), b}, old)
	e.start(true)
	e.poll("b's Lease to say disconnected", func() bool {
		l, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+"b", metav1.GetOptions{})
		return err == nil && l.Annotations[relay.OriginStateAnnotation] == source.Disconnected.String()
	})
	l, _ := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+"b", metav1.GetOptions{})
	if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.Equal(before) {
		t.Errorf("renewTime %v, want the one from before the restart, %v", l.Spec.RenewTime, before)
	}
}

// A hub deletes the Lease of a cluster it no longer reads (a peer taken out
// of its configuration) once LeaseGrace has passed, and only that: the
// Leases of its sources, a Lease not named for its label and another
// component's stay. With a long grace nothing goes.
func TestRelayLeasePrune(t *testing.T) {
	labelled := func(name, cluster string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: hubNS, Name: name, Labels: map[string]string{relay.OriginLabel: cluster}}}
	}
	for _, tc := range []struct {
		grace time.Duration
		gone  bool
	}{{50 * time.Millisecond, true}, {time.Hour, false}} {
		t.Run(fmt.Sprint("grace=", tc.grace), func(t *testing.T) {
			e := newEnv(t, Config{LocalCluster: "a", Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond, LeaseGrace: tc.grace},
				[]*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())},
				labelled(relay.LeasePrefix+"gone", "gone"), labelled(relay.LeasePrefix+"b", "b"), labelled(relay.LeasePrefix+"x", "y"),
				&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: hubNS, Name: "kube-scheduler"}})
			exists := func(name string) bool {
				_, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, name, metav1.GetOptions{})
				return err == nil
			}
			lists := func() int {
				n := 0
				for _, a := range e.client.Actions() {
					if a.GetVerb() == "list" && a.GetResource().Resource == "leases" {
						n++
					}
				}
				return n
			}
			e.start(true)
			if tc.gone {
				e.poll("the Lease of gone to go", func() bool { return !exists(relay.LeasePrefix + "gone") })
				if n := testutil.ToFloat64(e.metrics.Writes.WithLabelValues("lease_delete", "ok")); n != 1 {
					t.Errorf("%v Lease deletes counted, want 1", n)
				}
			} else {
				e.poll("the Leases listed", func() bool { return lists() > 0 && exists(relay.LeasePrefix+"a") })
				time.Sleep(20 * e.ctl.cfg.StatePoll) // looks that must delete nothing
				if !exists(relay.LeasePrefix + "gone") {
					t.Error("the Lease of gone was deleted before its grace")
				}
			}
			for _, name := range []string{relay.LeasePrefix + "a", relay.LeasePrefix + "b", relay.LeasePrefix + "x", "kube-scheduler"} {
				if !exists(name) {
					t.Errorf("Lease %s was deleted", name)
				}
			}
			if n := lists(); n != 1 {
				t.Errorf("the Leases were listed %d times, want once", n)
			}
		})
	}
}

// A failed list or delete of the Leases (an older Role without the verbs,
// an API server that refuses) is logged, counted and tried again after the
// grace, not at every look; the Lease goes once the delete succeeds.
func TestRelayLeasePruneRetries(t *testing.T) {
	gone := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: hubNS, Name: relay.LeasePrefix + "gone", Labels: map[string]string{relay.OriginLabel: "gone"}}}
	e := newEnv(t, Config{LocalCluster: "a", Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond, LeaseGrace: time.Second},
		[]*fakeSource{newSource("a", true, time.Now())}, gone)
	var mu sync.Mutex
	calls := map[string]int{}
	refuse := map[string]bool{"list": true, "delete": true}
	for _, verb := range []string{"list", "delete"} {
		e.client.PrependReactor(verb, "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			calls[verb]++
			if refuse[verb] {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "", errors.New("no such grant"))
			}
			return false, nil, nil
		})
	}
	count := func(verb string) int { mu.Lock(); defer mu.Unlock(); return calls[verb] }
	e.start(true)
	e.poll("a refused list", func() bool { return count("list") > 0 })
	time.Sleep(100 * time.Millisecond) // 20 looks within the grace
	if n := count("list"); n != 1 {
		t.Errorf("%d lists within one grace after a refusal, want 1", n)
	}
	mu.Lock()
	refuse["list"] = false
	mu.Unlock()
	// The reactor sees the delete before the controller counts its error:
	// wait for the count, not the call.
	e.poll("a refused delete, counted", func() bool {
		return testutil.ToFloat64(e.metrics.Writes.WithLabelValues("lease_delete", "error")) >= 1
	})
	time.Sleep(100 * time.Millisecond)
	if n := count("delete"); n != 1 {
		t.Errorf("%d deletes within one grace after a refusal, want 1", n)
	}
	mu.Lock()
	refuse["delete"] = false
	mu.Unlock()
	e.poll("the Lease of gone to go", func() bool {
		_, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, gone.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}
