package e2e

// Heartbeats end to end (issue 37): edge-o's real annotator signs a
// heartbeat every second (--sign-endpoints --heartbeat-interval 1s); hub-1's
// real MCS controller (--relay) copies it, bytes unchanged, into its Lease
// of edge-o; edge-e's real CoreDNS (verify, hub_heartbeat) reads only the
// hub and answers the origin's records unmarked. Then hub-1 turns hostile:
// its controller stops and the test, holding its API server, keeps writing
// that edge-o is connected (renewTime now) with the last heartbeat frozen.
// The edge marks edge-o stale (EDE 3, source_state disconnected) once the
// heartbeat is older than the timeout, counts the refusal, and a forged
// fresh heartbeat changes nothing but another refusal.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const heartbeatCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-e
        kubeconfig {KUBECONFIG}
        hub hub-1 {HUB1}
        verify {KEYS}
        hub_heartbeat {TIMEOUT}
        {EXTRA}
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

// startBeatingRelay starts edge-o exporting backend with n Pods, its
// annotator signing heartbeats every interval, hub-1 relaying it with its
// MCS controller (returned), and edge-e.
func startBeatingRelay(t *testing.T, ns string, n int, interval time.Duration) (relaySet, *harness.Annotator) {
	t.Helper()
	rs := startRelaySet(t, ns, "hub-1")
	rs.exportBackend(t, ns, n, "--heartbeat-interval", interval.String())
	hubCtl := harness.StartAnnotator(t, rs.hubs[0].Kubeconfig, "--cluster", "hub-1", "--leader-elect=false",
		"-mcs-controller", "--relay", "-peer", "edge-o="+rs.o.Kubeconfig)
	return rs, hubCtl
}

// startBeatEdge starts edge-e's CoreDNS reading hub-1 only, under verify
// with hub_heartbeat timeout; it returns it and its metrics port.
func startBeatEdge(t *testing.T, rs relaySet, timeout time.Duration, extra string) (*harness.CoreDNS, int) {
	t.Helper()
	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, heartbeatCorefile, map[string]string{
		"KUBECONFIG": rs.e.Kubeconfig,
		"HUB1":       rs.hubs[0].Kubeconfig,
		"KEYS":       rs.keysE.Dir,
		"TIMEOUT":    timeout.String(),
		"EXTRA":      extra,
		"METRICS":    strconv.Itoa(metrics),
	})
	return d, metrics
}

func TestHeartbeatThroughHostileHub(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	// Short, for the test: the defaults are a minute and five.
	const interval, timeout = time.Second, 8 * time.Second
	ns := "beat"
	rs, hubCtl := startBeatingRelay(t, ns, 1, interval)
	o, h, keysO := rs.o, rs.hubs[0], rs.keysO

	// The hub's Lease of edge-o carries the origin's heartbeat, as the
	// origin wrote it.
	hubLease := func() (map[string]string, string) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ls, err := h.Client.CoordinationV1().Leases(metav1.NamespaceAll).List(cx, metav1.ListOptions{LabelSelector: relay.OriginLabel + "=edge-o"})
		if err != nil || len(ls.Items) != 1 {
			return nil, ""
		}
		return ls.Items[0].Annotations, ls.Items[0].Namespace
	}
	var leaseNS string
	harness.Eventually(t, relayPropagation, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ol, err := o.Client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(cx, annotation.HeartbeatLeaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		hb, rej, ok := annotation.VerifyHeartbeat(keysO.Public, ol.Annotations[annotation.HeartbeatSignatureAnnotation], "edge-o", ol.Annotations[annotation.HeartbeatAnnotation])
		if !ok {
			return fmt.Errorf("origin heartbeat: %v", rej)
		}
		an, lns := hubLease()
		if an[relay.HeartbeatAnnotation] != ol.Annotations[annotation.HeartbeatAnnotation] ||
			an[relay.HeartbeatSignatureAnnotation] != ol.Annotations[annotation.HeartbeatSignatureAnnotation] {
			return fmt.Errorf("hub's Lease heartbeat %q, origin's %q (of %v)", an[relay.HeartbeatAnnotation], ol.Annotations[annotation.HeartbeatAnnotation], hb.At())
		}
		leaseNS = lns
		return nil
	})
	// What each heartbeat costs an edge: one watch event of the hub's
	// Lease, whole (managed fields included), as JSON and as protobuf (an
	// edge's client asks for protobuf).
	{
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := h.Client.CoordinationV1().Leases(leaseNS).Get(cx, relay.LeasePrefix+"edge-o", metav1.GetOptions{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(l)
		t.Logf("the hub's Lease of edge-o, as an edge receives it per heartbeat: %d bytes JSON, %d bytes protobuf (object only)", len(js), l.Size())
	}

	d, metrics := startBeatEdge(t, rs, timeout, "")
	name := svc("backend", ns)
	q := harness.Query{Name: name, Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}
	waitPeers(t, d, relayPropagation, q, marked(false, "edge-o", "10.7.0.1"))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="connected"}`, func(v float64) bool { return v == 1 })
	// Connected for longer than the timeout: the heartbeats keep coming.
	time.Sleep(timeout + 2*time.Second)
	waitPeers(t, d, propagation, q, marked(false, "edge-o", "10.7.0.1"))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="connected"}`, func(v float64) bool { return v == 1 })

	// hub-1 turns hostile: its controller stops, and whoever holds its API
	// server keeps saying edge-o is connected, renewTime now, with the last
	// heartbeat the hub had.
	hubCtl.Stop(t)
	frozen, _ := hubLease()
	say := func(annotations map[string]string) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		leases := h.Client.CoordinationV1().Leases(leaseNS)
		l, err := leases.Get(cx, relay.LeasePrefix+"edge-o", metav1.GetOptions{})
		if err != nil {
			t.Logf("hostile hub: %v", err)
			return
		}
		l.Annotations = annotations
		l.Annotations[relay.OriginStateAnnotation] = "connected"
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		if _, err := leases.Update(cx, l, metav1.UpdateOptions{}); err != nil {
			t.Logf("hostile hub: %v", err)
		}
	}
	var mu sync.Mutex
	saying := frozen
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			mu.Lock()
			an := make(map[string]string, len(saying))
			for k, v := range saying {
				an[k] = v
			}
			mu.Unlock()
			say(an)
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
		}
	})
	t.Cleanup(func() { close(done); wg.Wait() })
	start := time.Now()
	waitPeers(t, d, timeout+staleMark, q, marked(true, "edge-o", "10.7.0.1"))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="disconnected"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="stale_heartbeat"}`, func(v float64) bool { return v == 1 })
	t.Logf("with the hub saying connected and the heartbeat frozen, edge-o marked stale after %s (timeout %s)", time.Since(start).Round(time.Millisecond), timeout)

	// A fresh heartbeat the hub makes up (it has no key of edge-o's): still
	// stale, and refused.
	forge := newSigningKeyPair(t, "edge-o")
	fake := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: "edge-o", Time: time.Now().UnixMilli()})
	mu.Lock()
	saying = map[string]string{relay.HeartbeatAnnotation: fake, relay.HeartbeatSignatureAnnotation: annotation.SignHeartbeat(forge.Private, "edge-o", fake)}
	mu.Unlock()
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="bad_heartbeat"}`, func(v float64) bool { return v == 1 })
	time.Sleep(2 * time.Second)
	waitPeers(t, d, propagation, q, marked(true, "edge-o", "10.7.0.1"))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="disconnected"}`, func(v float64) bool { return v == 1 })
	// Each refusal is logged once, with its reason.
	harness.Eventually(t, propagation, func() error {
		lines := grepLog(d, "hub hub-1: origin edge-o: refused")
		if len(lines) != 2 || !strings.Contains(lines[0], "stale_heartbeat") || !strings.Contains(lines[1], "bad_heartbeat") {
			return fmt.Errorf("refusals logged: %q", lines)
		}
		return nil
	})
	t.Logf("CoreDNS on the hostile hub: %s", strings.Join(grepLog(d, "origin edge-o: refused"), "\n"))
}

// Pod lists end to end (issue 37): edge-o's annotator exports backend-1
// and backend-2 and signs, with each heartbeat, the list of its Pods;
// hub-1's controller copies heartbeat and list into its Lease; edge-e reads
// only the hub. Then hub-1 turns hostile: its controller stops, its slices
// keep backend-2's last ready statement, and whoever holds its API server
// keeps copying the origin's fresh heartbeat and list into its Lease, so
// that edge-o stays connected through it. The origin deletes backend-2: its
// next list does not name it, and the edge stops answering it, unmarked
// (the origin is still current), counting and logging the drop once. The
// origin makes backend-2 again under its name: the hostile hub still holds
// only the old Pod's statement, which the origin's lists by UID do not name,
// so neither that edge nor one started since answers it. Last,
// the hostile hub withholds the lists while it passes the fresh heartbeats:
// having seen lists of edge-o, the edge no longer takes the hub's word that
// edge-o is connected, and marks its answers stale.
func TestDeletedPodThroughHostileHub(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	const interval, timeout = time.Second, 8 * time.Second
	ns := "gone"
	rs, hubCtl := startBeatingRelay(t, ns, 2, interval)
	o, h, keysO := rs.o, rs.hubs[0], rs.keysO

	// originLease is what the origin's heartbeat Lease carries.
	originLease := func() (map[string]string, error) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := o.Client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(cx, annotation.HeartbeatLeaseName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return l.Annotations, nil
	}
	// The hub's Lease carries the origin's list, naming both Pods.
	var leaseNS string
	harness.Eventually(t, relayPropagation, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ls, err := h.Client.CoordinationV1().Leases(metav1.NamespaceAll).List(cx, metav1.ListOptions{LabelSelector: relay.OriginLabel + "=edge-o"})
		if err != nil || len(ls.Items) != 1 {
			return fmt.Errorf("hub's Leases of edge-o: %v", err)
		}
		an := ls.Items[0].Annotations
		_, set, rej, ok := annotation.VerifyPodList(keysO.Public, an[relay.PodListSignatureAnnotation], "edge-o", an[relay.PodListAnnotation])
		if !ok || !set.Has(ns, "backend-1") || !set.Has(ns, "backend-2") {
			return fmt.Errorf("hub's Lease Pod list %.100q (%v): want one naming both Pods", an[relay.PodListAnnotation], rej)
		}
		leaseNS = ls.Items[0].Namespace
		t.Logf("per heartbeat, the Pod list of 2 Pods adds %d bytes of annotation values (list %d, signature %d)",
			len(an[relay.PodListAnnotation])+len(an[relay.PodListSignatureAnnotation]), len(an[relay.PodListAnnotation]), len(an[relay.PodListSignatureAnnotation]))
		return nil
	})

	d, metrics := startBeatEdge(t, rs, timeout, "")
	q := harness.Query{Name: svc("backend", ns), Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}
	waitPeers(t, d, relayPropagation, q, marked(false, "edge-o", "10.7.0.1", "10.7.0.2"))

	// hub-1 turns hostile: its slices stay as they are (backend-2 ready),
	// and its Lease of edge-o follows the origin's heartbeat and list.
	hubCtl.Stop(t)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var withhold, stripUIDs atomic.Bool
	wg.Go(func() {
		for {
			if an, err := originLease(); err == nil {
				cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				leases := h.Client.CoordinationV1().Leases(leaseNS)
				if l, err := leases.Get(cx, relay.LeasePrefix+"edge-o", metav1.GetOptions{}); err == nil {
					l.Annotations[relay.OriginStateAnnotation] = "connected"
					l.Annotations[relay.HeartbeatAnnotation] = an[annotation.HeartbeatAnnotation]
					l.Annotations[relay.HeartbeatSignatureAnnotation] = an[annotation.HeartbeatSignatureAnnotation]
					l.Annotations[relay.PodListAnnotation] = an[annotation.PodListAnnotation]
					l.Annotations[relay.PodListSignatureAnnotation] = an[annotation.PodListSignatureAnnotation]
					l.Annotations[relay.PodUIDListAnnotation] = an[annotation.PodUIDListAnnotation]
					l.Annotations[relay.PodUIDListSignatureAnnotation] = an[annotation.PodUIDListSignatureAnnotation]
					if withhold.Load() {
						delete(l.Annotations, relay.PodListAnnotation)
						delete(l.Annotations, relay.PodListSignatureAnnotation)
					}
					if withhold.Load() || stripUIDs.Load() {
						delete(l.Annotations, relay.PodUIDListAnnotation)
						delete(l.Annotations, relay.PodUIDListSignatureAnnotation)
					}
					l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
					if _, err := leases.Update(cx, l, metav1.UpdateOptions{}); err != nil {
						t.Logf("hostile hub: %v", err)
					}
				}
				cancel()
			}
			select {
			case <-done:
				return
			case <-time.After(interval):
			}
		}
	})
	t.Cleanup(func() { close(done); wg.Wait() })
	// Past the heartbeat timeout: the hub still passes for current, and
	// still answers both Pods.
	time.Sleep(timeout + 2*time.Second)
	waitPeers(t, d, propagation, q, marked(false, "edge-o", "10.7.0.1", "10.7.0.2"))

	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := o.Client.CoreV1().Pods(ns).Delete(cx, "backend-2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitPeers(t, d, relayPropagation, q, marked(false, "edge-o", "10.7.0.1"))
	t.Logf("backend-2 deleted at the origin, kept by the hostile hub: gone from the answers after %s (heartbeat interval %s)", time.Since(start).Round(time.Millisecond), interval)
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="unlisted"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="connected"}`, func(v float64) bool { return v == 1 })
	// Later lists change nothing: one drop, one log line.
	time.Sleep(3 * interval)
	waitPeers(t, d, propagation, q, marked(false, "edge-o", "10.7.0.1"))
	harness.Eventually(t, propagation, func() error {
		lines := grepLog(d, "Pod gone/backend-2: relayed record refused")
		if len(lines) != 1 || !strings.Contains(lines[0], "unlisted") {
			return fmt.Errorf("drops logged: %q", lines)
		}
		return nil
	})
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="unlisted"}`, func(v float64) bool { return v == 1 })

	// backend-2 is made again under its name (a StatefulSet's Pod), with
	// another address; the hostile hub never relays it and keeps the old
	// Pod's statement. The origin's lists name backend-2 again: by name
	// they would name the old statement too; by UID they do not. An edge
	// started now, that never saw a list without backend-2, does not
	// answer the old Pod's address either.
	plainPod(t, o, ns, "backend-2", "10.7.0.3", map[string]string{"app": "backend"})
	again := waitSignedStatement(t, o, ns, "backend-2", keysO, func(e annotation.Endpoint) bool { return e.Ready })
	harness.Eventually(t, relayPropagation, func() error {
		an, err := originLease()
		if err != nil {
			return err
		}
		_, byName, _, ok := annotation.VerifyPodList(keysO.Public, an[annotation.PodListSignatureAnnotation], "edge-o", an[annotation.PodListAnnotation])
		_, byUID, rej, uok := annotation.VerifyPodUIDList(keysO.Public, an[annotation.PodUIDListSignatureAnnotation], "edge-o", an[annotation.PodUIDListAnnotation])
		if !ok || !uok || !byName.Has(ns, "backend-2") || !byUID.HasHash(annotation.PodUIDHash(ns, "backend-2", again.uid)) {
			return fmt.Errorf("origin's lists do not name the new backend-2 yet (%v)", rej)
		}
		return nil
	})
	later, laterMetrics := startBeatEdge(t, rs, timeout, "")
	waitPeers(t, later, relayPropagation, q, marked(false, "edge-o", "10.7.0.1"))
	for _, e := range []*harness.CoreDNS{d, later} {
		consistentlyPeers(t, e, 3*interval, q, marked(false, "edge-o", "10.7.0.1"))
	}
	eventuallyRelayMetric(t, laterMetrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="unlisted"}`, func(v float64) bool { return v == 1 })
	t.Logf("backend-2 made again (uid %s): the old Pod's statement the hostile hub keeps stays out of the answers, at an edge started since too", again.uid)

	// The hostile hub withholds the lists, passing the heartbeats: edge-o
	// is no longer current through it, its answers marked stale.
	withhold.Store(true)
	start = time.Now()
	waitPeers(t, d, relayPropagation+staleMark, q, marked(true, "edge-o", "10.7.0.1"))
	t.Logf("with the hub withholding edge-o's Pod lists, edge-o marked stale after %s", time.Since(start).Round(time.Millisecond))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="disconnected"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="withheld_pod_list"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="no_pod_list"}`, func(v float64) bool { return v == 0 })

	// Two edges started now, that never saw a list. Without
	// hub_require_pod_lists the withholding hub passes for current
	// (no_pod_list), and the backend-2 it keeps is answered, unmarked: the
	// gap the option closes. With it, edge-o is not current through the hub
	// from the start: answers marked stale.
	fresh, freshMetrics := startBeatEdge(t, rs, timeout, "")
	waitPeers(t, fresh, relayPropagation, q, marked(false, "edge-o", "10.7.0.1", "10.7.0.2"))
	eventuallyRelayMetric(t, freshMetrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="no_pod_list"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, freshMetrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="connected"}`, func(v float64) bool { return v == 1 })
	req, reqMetrics := startBeatEdge(t, rs, timeout, "hub_require_pod_lists")
	start = time.Now()
	waitPeers(t, req, relayPropagation+staleMark, q, marked(true, "edge-o", "10.7.0.1", "10.7.0.2"))
	t.Logf("an edge requiring Pod lists, started while the hub withholds them: edge-o marked stale after %s", time.Since(start).Round(time.Millisecond))
	eventuallyRelayMetric(t, reqMetrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="disconnected"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, reqMetrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="withheld_pod_list"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, reqMetrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="no_pod_list"}`, func(v float64) bool { return v == 0 })

	// The hostile hub passes the lists by name and strips those by UID.
	// An edge started now takes the list by name, which names backend-2:
	// the old Pod's address is answered, unmarked (the gap lists by UID
	// close once seen). One with hub_require_pod_lists uids takes edge-o
	// as not current through the hub: answers marked stale.
	withhold.Store(false)
	stripUIDs.Store(true)
	time.Sleep(2 * interval)
	byName, _ := startBeatEdge(t, rs, timeout, "")
	waitPeers(t, byName, relayPropagation, q, marked(false, "edge-o", "10.7.0.1", "10.7.0.2"))
	uidReq, uidReqMetrics := startBeatEdge(t, rs, timeout, "hub_require_pod_lists uids")
	start = time.Now()
	waitPeers(t, uidReq, relayPropagation+staleMark, q, marked(true, "edge-o", "10.7.0.1", "10.7.0.2"))
	t.Logf("an edge requiring Pod lists by UID, started while the hub strips them: edge-o marked stale after %s", time.Since(start).Round(time.Millisecond))
	eventuallyRelayMetric(t, uidReqMetrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="withheld_pod_list"}`, func(v float64) bool { return v == 1 })
}
