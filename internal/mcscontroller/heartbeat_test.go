package mcscontroller

import (
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
)

func heartbeatLease(value, sig string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace: annotation.HeartbeatLeaseNamespace, Name: annotation.HeartbeatLeaseName,
		Annotations: map[string]string{annotation.HeartbeatAnnotation: value, annotation.HeartbeatSignatureAnnotation: sig},
	}}
}

// A hub copies each source cluster's heartbeat and signature into its Lease
// of the cluster, the bytes unchanged (it verifies nothing), and again when
// they change; an oversized one is not copied; a cluster without a
// heartbeat Lease has none.
func TestRelayCopiesHeartbeat(t *testing.T) {
	// Bytes a re-encoding would change: spacing, an escape, key order.
	v1 := `{ "time":1790000000000,"cluster":"a\u0061"}`
	s1 := "ed25519:not-checked-by-the-hub"
	originA := fake.NewClientset(heartbeatLease(v1, s1))
	originB := fake.NewClientset()
	a, b := newSource("a", true, time.Now()), newSource("b", true, time.Now())
	e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond,
		Heartbeats: map[string]kubernetes.Interface{"a": originA, "b": originB}}, []*fakeSource{a, b})
	hubLease := func(cluster string) map[string]string {
		l, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+cluster, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return l.Annotations
	}
	e.start(true)
	e.poll("a's heartbeat on the hub's Lease, and b's Lease", func() bool {
		an := hubLease("a")
		return an[relay.HeartbeatAnnotation] == v1 && an[relay.HeartbeatSignatureAnnotation] == s1 && hubLease("b") != nil
	})
	if an := hubLease("b"); an == nil || an[relay.HeartbeatAnnotation] != "" || an[relay.HeartbeatSignatureAnnotation] != "" {
		t.Errorf("Lease of b, which has no heartbeat: %v", an)
	}
	// A new heartbeat: the hub's Lease follows, its state unchanged.
	v2, s2 := `{"cluster":"a","time":1790000060000}`, "ed25519:second"
	if _, err := originA.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Update(e.ctx, heartbeatLease(v2, s2), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the new heartbeat", func() bool {
		an := hubLease("a")
		return an[relay.HeartbeatAnnotation] == v2 && an[relay.HeartbeatSignatureAnnotation] == s2 && an[relay.OriginStateAnnotation] == "connected"
	})
	// An oversized one is not relayed: the hub's Lease has no heartbeat.
	big := `{"cluster":"a","time":1,"pad":"` + strings.Repeat("x", annotation.MaxHeartbeatBytes) + `"}`
	if _, err := originA.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Update(e.ctx, heartbeatLease(big, s2), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the oversized heartbeat dropped", func() bool {
		an := hubLease("a")
		return an != nil && an[relay.HeartbeatAnnotation] == "" && an[relay.OriginStateAnnotation] == "connected"
	})
}

// A cluster's first Lease write waits for the first list of its heartbeat
// (so that a restarted hub does not drop the heartbeat its Lease carries),
// at most Config.HeartbeatWait; a cluster without a heartbeat reader does not
// wait.
func TestRelayLeaseWaitsForHeartbeat(t *testing.T) {
	for _, listed := range []bool{true, false} {
		t.Run(map[bool]string{true: "heartbeat listed", false: "heartbeat never listed"}[listed], func(t *testing.T) {
			wait := time.Hour
			if !listed {
				wait = 500 * time.Millisecond
			}
			release := make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			v, s := `{"cluster":"a","time":1790000000000}`, "ed25519:x"
			originA := fake.NewClientset(heartbeatLease(v, s))
			originA.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				<-release
				return false, nil, nil
			})
			a, b := newSource("a", true, time.Now()), newSource("b", true, time.Now())
			e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond, HeartbeatWait: wait,
				Heartbeats: map[string]kubernetes.Interface{"a": originA}}, []*fakeSource{a, b})
			hubLease := func(cluster string) map[string]string {
				l, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+cluster, metav1.GetOptions{})
				if err != nil {
					return nil
				}
				return l.Annotations
			}
			e.start(true)
			e.poll("b's Lease (no heartbeat reader: no wait)", func() bool { return hubLease("b") != nil })
			if !listed {
				e.poll("a's Lease once the wait is over, without a heartbeat", func() bool {
					an := hubLease("a")
					return an != nil && an[relay.HeartbeatAnnotation] == ""
				})
				return
			}
			time.Sleep(200 * time.Millisecond)
			if an := hubLease("a"); an != nil {
				t.Fatalf("a's Lease written before its heartbeat listed: %v", an)
			}
			once.Do(func() { close(release) })
			e.poll("a's Lease, with its heartbeat from the first write", func() bool {
				an := hubLease("a")
				return an != nil && an[relay.HeartbeatAnnotation] == v
			})
		})
	}
}

// A hub copies the Pod lists written with a heartbeat (by name, by UID),
// and their signatures, the bytes unchanged, beside the heartbeat; an
// oversized list is not copied, the other list and the heartbeat still
// are.
func TestRelayCopiesPodList(t *testing.T) {
	uids := func(pods string) string { return strings.Replace(pods, `"pods"`, ` "pods"`, 1) } // the list by UID: other bytes
	big := `"pods":"` + strings.Repeat("A", annotation.MaxPodListBytes) + `"`
	withList := func(beat, pods, podsSig string, bigUIDs bool) *coordinationv1.Lease {
		l := heartbeatLease(beat, "ed25519:beat")
		l.Annotations[annotation.PodListAnnotation] = pods
		l.Annotations[annotation.PodListSignatureAnnotation] = podsSig
		l.Annotations[annotation.PodUIDListAnnotation] = uids(pods)
		if bigUIDs {
			l.Annotations[annotation.PodUIDListAnnotation] = strings.Replace(pods, `"pods":""`, big, 1)
		}
		l.Annotations[annotation.PodUIDListSignatureAnnotation] = podsSig + "u"
		return l
	}
	v1 := `{"cluster":"a","time":1790000000000}`
	p1 := `{ "pods":"","cluster":"a","time":1790000000000}` // bytes a re-encoding would change
	origin := fake.NewClientset(withList(v1, p1, "ed25519:list", false))
	a := newSource("a", true, time.Now())
	e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond,
		Heartbeats: map[string]kubernetes.Interface{"a": origin}}, []*fakeSource{a})
	hubLease := func() map[string]string {
		l, err := e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+"a", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return l.Annotations
	}
	e.start(true)
	for _, tc := range []struct {
		name, beat, pods, podsSig string
		bigUIDs                   bool
		wantPods, wantSig         string
		noUIDs                    bool // the list by UID is not copied, the list by name is
	}{
		{name: "copied", beat: v1, pods: p1, podsSig: "ed25519:list", wantPods: p1, wantSig: "ed25519:list"},
		{name: "a new one", beat: `{"cluster":"a","time":1790000060000}`, pods: `{"cluster":"a","time":1790000060000,"pods":"AAAAAAAAAAE="}`, podsSig: "ed25519:list2",
			wantPods: `{"cluster":"a","time":1790000060000,"pods":"AAAAAAAAAAE="}`, wantSig: "ed25519:list2"},
		{name: "oversized list", beat: `{"cluster":"a","time":1790000120000}`, pods: `{"cluster":"a","time":1790000120000,"pods":"` + strings.Repeat("A", annotation.MaxPodListBytes) + `"}`, podsSig: "ed25519:list3"},
		{name: "oversized signature", beat: `{"cluster":"a","time":1790000180000}`, pods: p1, podsSig: "ed25519:" + strings.Repeat("A", maxBeatSignatureBytes)},
		{name: "oversized list by UID", beat: `{"cluster":"a","time":1790000240000}`, pods: `{"cluster":"a","time":1790000240000,"pods":""}`, podsSig: "ed25519:list4", bigUIDs: true,
			wantPods: `{"cluster":"a","time":1790000240000,"pods":""}`, wantSig: "ed25519:list4", noUIDs: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := origin.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Update(e.ctx, withList(tc.beat, tc.pods, tc.podsSig, tc.bigUIDs), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.poll("the heartbeat on the hub's Lease", func() bool { return hubLease()[relay.HeartbeatAnnotation] == tc.beat })
			an := hubLease()
			if an[relay.PodListAnnotation] != tc.wantPods || an[relay.PodListSignatureAnnotation] != tc.wantSig {
				t.Errorf("hub's Lease carries list %.80q signed %.40q; want %.80q signed %.40q",
					an[relay.PodListAnnotation], an[relay.PodListSignatureAnnotation], tc.wantPods, tc.wantSig)
			}
			wantUIDs, wantUIDsSig := "", ""
			if tc.wantPods != "" && !tc.noUIDs {
				wantUIDs, wantUIDsSig = uids(tc.wantPods), tc.wantSig+"u"
			}
			if an[relay.PodUIDListAnnotation] != wantUIDs || an[relay.PodUIDListSignatureAnnotation] != wantUIDsSig {
				t.Errorf("hub's Lease carries list by UID %.80q signed %.40q; want %.80q signed %.40q",
					an[relay.PodUIDListAnnotation], an[relay.PodUIDListSignatureAnnotation], wantUIDs, wantUIDsSig)
			}
		})
	}
}

// A cluster not heard from since a restart has its Lease merge-patched (its
// renewTime kept): a heartbeat that comes without a Pod list removes the
// list the Lease had, which is older than it.
func TestRelayLeaseMergeDropsOldPodList(t *testing.T) {
	before := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	old := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: hubNS, Name: relay.LeasePrefix + "a",
		Annotations: map[string]string{
			relay.HeartbeatAnnotation: `{"cluster":"a","time":1790000000000}`, relay.HeartbeatSignatureAnnotation: "ed25519:old",
			relay.PodListAnnotation: `{"cluster":"a","time":1790000000000,"pods":""}`, relay.PodListSignatureAnnotation: "ed25519:oldlist",
			relay.PodUIDListAnnotation: `{"cluster":"a","time":1790000000000,"pods":""}`, relay.PodUIDListSignatureAnnotation: "ed25519:olduids",
		}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: before}}}
	v2 := `{"cluster":"a","time":1790000060000}`
	origin := fake.NewClientset(heartbeatLease(v2, "ed25519:new")) // an older annotator: no list
	a := newSource("a", false, time.Time{})
	a.cut.Store(true)
	e := newEnv(t, Config{Relay: true, RelayNamespace: hubNS, StatePoll: 5 * time.Millisecond,
		Heartbeats: map[string]kubernetes.Interface{"a": origin}}, []*fakeSource{newSource("hub", true, time.Now()), a}, old)
	e.start(true)
	var l *coordinationv1.Lease
	e.poll("the new heartbeat on the hub's Lease", func() bool {
		var err error
		l, err = e.client.CoordinationV1().Leases(hubNS).Get(e.ctx, relay.LeasePrefix+"a", metav1.GetOptions{})
		return err == nil && l.Annotations[relay.HeartbeatAnnotation] == v2
	})
	if p, s := l.Annotations[relay.PodListAnnotation], l.Annotations[relay.PodListSignatureAnnotation]; p != "" || s != "" {
		t.Errorf("the Lease keeps the older list %q (%q) beside the new heartbeat", p, s)
	}
	if p, s := l.Annotations[relay.PodUIDListAnnotation], l.Annotations[relay.PodUIDListSignatureAnnotation]; p != "" || s != "" {
		t.Errorf("the Lease keeps the older list by UID %q (%q) beside the new heartbeat", p, s)
	}
	if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.Equal(before) {
		t.Errorf("renewTime %v, want the one from before the restart, %v", l.Spec.RenewTime, before)
	}
}
