package e2e

// The relay's replay memory survives a restart: edge-o's real annotator
// signs its Pods' statements, hub-1's real MCS controller relays them, and
// edge-e's real CoreDNS (verify and snapshot on) reads only hub-1. An origin
// Pod goes not ready, then is deleted (as a Pod being deleted gets one last
// statement saying not ready; the test's API servers run no kubelet, so the
// test flips it first); the edge drops it and remembers its last statement
// (a tombstone, in the snapshot). CoreDNS restarts; hub-1
// then turns hostile (its controller stopped, its API server written by the
// test) and presents the deleted Pod's earlier, ready statement: the edge
// does not answer it and counts a replayed refusal, as it would have before
// the restart.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const replayMemCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-e
        kubeconfig {KUBECONFIG}
        hub hub-1 {HUB1}
        snapshot {SNAPSHOT}
        verify {KEYS}
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

func TestRelayReplayMemorySurvivesRestart(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	ns := "replaymem"
	rs := startRelaySet(t, ns, "hub-1")
	o, h1, e, keysO, keysE := rs.o, rs.hubs[0], rs.e, rs.keysO, rs.keysE
	// What a hostile hub will present later: backend-2's ready statement.
	ready2 := rs.exportBackend(t, ns, 2)[1]
	hubCtl := harness.StartAnnotator(t, h1.Kubeconfig, "--cluster", "hub-1", "--leader-elect=false",
		"-mcs-controller", "--relay", "-peer", "edge-o="+o.Kubeconfig)

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, replayMemCorefile, map[string]string{
		"KUBECONFIG": e.Kubeconfig,
		"HUB1":       h1.Kubeconfig,
		"SNAPSHOT":   snapshotPath(t),
		"KEYS":       keysE.Dir,
		"METRICS":    strconv.Itoa(metrics),
	})
	q := harness.Query{Name: svc("backend", ns), Type: dns.TypeA, Timeout: peerQueryTimeout}
	waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1", "10.7.0.2"))

	// backend-2 goes not ready (a newer statement), then is deleted: the
	// edge drops its record and remembers the newer statement.
	o.SetPodReady(t, ns, "backend-2", false, "10.7.0.2")
	notReady := waitSignedStatement(t, o, ns, "backend-2", keysO, func(e annotation.Endpoint) bool { return !e.Ready })
	if notReady.endpoint.Seq <= ready2.endpoint.Seq {
		t.Fatalf("not-ready statement seq %d, not after the ready one's %d", notReady.endpoint.Seq, ready2.endpoint.Seq)
	}
	waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1"))
	o.DeletePod(t, ns, "backend-2")
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_records{cluster="edge-o"}`, func(v float64) bool { return v == 1 })

	// The edge restarts (from its snapshot) and lists the hub again.
	d.Restart(t)
	waitPeers(t, d, initialSync, q, hasAddrs("10.7.0.1"))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_hub_state{hub="hub-1",state="connected"}`, func(v float64) bool { return v == 1 })
	t.Logf("CoreDNS after the restart: %s", strings.Join(grepLog(d, "replay memory"), "\n"))

	// hub-1 turns hostile and presents the deleted Pod's ready statement,
	// signed by the origin but older than the one the edge accepted.
	hubCtl.Stop(t)
	writeRelaySlice(t, h1, ns, "backend-replayed", "edge-o", relay.Slice{Exports: []string{ready2.export},
		Pods: []relay.Pod{{Name: "backend-2", UID: ready2.uid, Endpoint: ready2.raw, Signature: ready2.sig}}})
	stop := watchAnswers(t, d, q, []string{"10.7.0.1"})
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-1",reason="replayed"}`, func(v float64) bool { return v == 1 })
	time.Sleep(3 * time.Second)
	if n, bad := stop(); len(bad) > 0 {
		t.Fatalf("after the restart, the deleted Pod's replayed statement answered: %d of %d answers were not the origin's endpoints: first %s", len(bad), n, bad[0])
	}
	t.Logf("CoreDNS on the replay: %s", strings.Join(grepLog(d, "relayed record refused"), "\n"))
}

// TestMCSControllerReplayMemorySurvivesRestart: the same for the MCS
// controller of an edge that reads hub-1 under --verify with --snapshot-dir,
// and for a hub of hubs (the same with --relay: its snapshot keeps the
// replay memory only). backend-2 goes not ready, then is deleted; the
// controller restarts (from its snapshot); hub-1 turns hostile and presents
// backend-2's earlier, ready statement: the controller refuses it as
// replayed (it did not before this memory was kept: it took the statement
// after a restart), and edge-e's EndpointSlices never name backend-2 again.
func TestMCSControllerReplayMemorySurvivesRestart(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	for _, tc := range []struct {
		name, ns string
		extra    []string
	}{
		{"edge", "ctlreplay", nil},
		{"hub of hubs", "ctlreplay-relay", []string{"--relay"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testControllerReplayMemory(t, tc.ns, tc.extra) })
	}
}

func testControllerReplayMemory(t *testing.T, ns string, extra []string) {
	rs := startRelaySet(t, ns, "hub-1")
	o, h1, e, keysO, keysE := rs.o, rs.hubs[0], rs.e, rs.keysO, rs.keysE
	e.InstallMCSCRDs(t)
	e.CreateNamespace(t, ns)
	ready2 := rs.exportBackend(t, ns, 2)[1]
	hubCtl := harness.StartAnnotator(t, h1.Kubeconfig, "--cluster", "hub-1", "--leader-elect=false",
		"-mcs-controller", "--relay", "-peer", "edge-o="+o.Kubeconfig)
	edgeArgs := append([]string{"--cluster", "edge-e", "--leader-elect=false", "-mcs-controller",
		"--hub", "hub-1=" + h1.Kubeconfig, "--verify", keysE.Dir, "--snapshot-dir", t.TempDir()}, extra...)
	edge := harness.StartAnnotator(t, e.Kubeconfig, edgeArgs...)
	addrs := func(want ...string) func(mcsView) error {
		return func(v mcsView) error {
			if got := v.addrsBy()["edge-o"]; !slices.Equal(got, want) {
				return fmt.Errorf("edge-o's endpoints %v, want %v", got, want)
			}
			return nil
		}
	}
	eventuallyMCS(t, e, ns, "backend", "both Pods imported through hub-1", addrs("10.7.0.1", "10.7.0.2"))

	// backend-2 goes not ready (a newer statement), then is deleted: the
	// controller drops it and remembers the newer statement.
	o.SetPodReady(t, ns, "backend-2", false, "10.7.0.2")
	notReady := waitSignedStatement(t, o, ns, "backend-2", keysO, func(e annotation.Endpoint) bool { return !e.Ready })
	if notReady.endpoint.Seq <= ready2.endpoint.Seq {
		t.Fatalf("not-ready statement seq %d, not after the ready one's %d", notReady.endpoint.Seq, ready2.endpoint.Seq)
	}
	eventuallyMCS(t, e, ns, "backend", "backend-2 not ready", func(v mcsView) error {
		for _, sl := range v.slices {
			for _, ep := range sl.Endpoints {
				if slices.Contains(ep.Addresses, "10.7.0.2") && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					return nil
				}
			}
		}
		return fmt.Errorf("10.7.0.2 not marked not ready")
	})
	o.DeletePod(t, ns, "backend-2")
	eventuallyMCS(t, e, ns, "backend", "backend-2 gone", addrs("10.7.0.1"))

	// The controller restarts from its snapshot and reads the hub again.
	edge.Stop(t)
	edge = harness.StartAnnotator(t, e.Kubeconfig, edgeArgs...)
	eventuallyMetric(t, edge, `mcs_controller_hub_state{hub="hub-1",state="connected"}`, "1", func(v float64) bool { return v == 1 })
	if lines := grepLines(edge.Log(), "(replay memory)"); len(lines) == 0 {
		t.Errorf("the restarted controller logged no replay memory from its snapshot")
	} else {
		t.Logf("controller after the restart: %s", strings.Join(lines, "\n"))
	}

	// hub-1 turns hostile and presents backend-2's ready statement, signed
	// by the origin but older than the one the controller accepted.
	hubCtl.Stop(t)
	writeRelaySlice(t, h1, ns, "backend-replayed", "edge-o", relay.Slice{Exports: []string{ready2.export},
		Pods: []relay.Pod{{Name: "backend-2", UID: ready2.uid, Endpoint: ready2.raw, Signature: ready2.sig}}})
	eventuallyMetric(t, edge, `mcs_controller_relay_refused_total{hub="hub-1",reason="replayed"}`, "1", func(v float64) bool { return v == 1 })
	harness.Consistently(t, 3*time.Second, 200*time.Millisecond, func() error {
		v, err := readMCS(e, ns, "backend")
		if err != nil {
			return err
		}
		if err := addrs("10.7.0.1")(v); err != nil {
			return fmt.Errorf("after the restart, the deleted Pod's replayed statement was imported: %v", err)
		}
		return nil
	})
}

// grepLines returns the lines of log that contain s.
func grepLines(log, s string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}
