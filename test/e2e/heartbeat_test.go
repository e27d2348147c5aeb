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
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

func TestHeartbeatThroughHostileHub(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	// Short, for the test: the defaults are a minute and five.
	const interval, timeout = time.Second, 8 * time.Second
	ns := "beat"
	rs := startRelaySet(t, ns, "hub-1")
	o, h, e, keysO, keysE := rs.o, rs.hubs[0], rs.e, rs.keysO, rs.keysE
	rs.exportBackend(t, ns, 1, "--heartbeat-interval", interval.String())
	hubCtl := harness.StartAnnotator(t, h.Kubeconfig, "--cluster", "hub-1", "--leader-elect=false",
		"-mcs-controller", "--relay", "-peer", "edge-o="+o.Kubeconfig)

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

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, heartbeatCorefile, map[string]string{
		"KUBECONFIG": e.Kubeconfig,
		"HUB1":       h.Kubeconfig,
		"KEYS":       keysE.Dir,
		"TIMEOUT":    timeout.String(),
		"METRICS":    strconv.Itoa(metrics),
	})
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
