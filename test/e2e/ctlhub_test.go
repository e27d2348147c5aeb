package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestMCSControllerReadsHub: an origin (edge-o) whose real annotator signs
// its exports and endpoint statements; a hub (hub-1) running the real MCS
// controller with --relay, reading edge-o as a peer; an edge (edge-e)
// running the real MCS controller with --hub hub-1 and --verify, never
// reading edge-o. The edge gets edge-o's ServiceImport and an EndpointSlice
// of edge-o with its Pods' addresses (no relay annotation: the edge is no
// hub); once its link to the hub is cut, and the controller says the hub is
// disconnected, the objects stay.
func TestMCSControllerReadsHub(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	const ns = "ctlhub"
	cs := mcsClusters(t, ns, "edge-o", "hub-1", "edge-e")
	o, h, e := cs[0], cs[1], cs[2]
	keysO := newSigningKeyPair(t, "edge-o")
	keysE := newSigningKeyPair(t, "edge-e")
	trustKey(t, keysO, "edge-o", keysE)

	sel := map[string]string{"app": "web"}
	createSignedTestService(t, o, ns, "web", sel)
	plainPod(t, o, ns, "web-1", "10.9.0.1", sel)
	plainPod(t, o, ns, "web-2", "10.9.0.2", sel)
	harness.StartAnnotator(t, o.Kubeconfig, "--cluster", "edge-o", "--sign-key", keysO.PrivatePath, "--sign-endpoints", "--leader-elect=false")
	waitSignedStatement(t, o, ns, "web-1", keysO, func(e annotation.Endpoint) bool { return e.Ready })
	waitSignedStatement(t, o, ns, "web-2", keysO, func(e annotation.Endpoint) bool { return e.Ready })

	harness.StartAnnotator(t, h.Kubeconfig, "--cluster", "hub-1", "--leader-elect=false",
		"-mcs-controller", "--relay", "-peer", "edge-o="+o.Kubeconfig)

	link := harness.StartProxy(t, h.APIServerAddr())
	edge := harness.StartAnnotator(t, e.Kubeconfig, "--cluster", "edge-e", "--leader-elect=false",
		"-mcs-controller", "--hub", "hub-1="+h.KubeconfigVia(t, link), "--verify", keysE.Dir)

	want := []string{"10.9.0.1", "10.9.0.2"}
	imported := func(v mcsView) error {
		if v.imp == nil || len(v.imp.Status.Clusters) != 1 || v.imp.Status.Clusters[0].Cluster != "edge-o" {
			return fmt.Errorf("no ServiceImport of edge-o")
		}
		if got := v.addrsBy()["edge-o"]; !slices.Equal(got, want) {
			return fmt.Errorf("edge-o's endpoints %v, want %v", got, want)
		}
		for _, s := range v.slices {
			if _, ok := s.Annotations[relay.SliceAnnotation]; ok {
				return fmt.Errorf("slice %s carries the relay annotation", s.Name)
			}
		}
		return nil
	}
	v := eventuallyMCS(t, e, ns, "web", "edge-o's export imported through hub-1", imported)
	t.Logf("edge-e through hub-1: %v", v)
	eventuallyMetric(t, edge, `mcs_controller_origin_via{hub="hub-1",origin="edge-o"}`, "1", func(v float64) bool { return v == 1 })
	if v, found, err := edge.Metric(`mcs_controller_relay_refused_total`); err != nil || (found && v != 0) {
		t.Errorf("the origin's signed records refused: %v (%v)", v, err)
	}

	// The link to the hub is cut: once the controller knows, the objects
	// are still there, unchanged.
	link.Cut(t)
	eventuallyMetric(t, edge, `mcs_controller_hub_state{hub="hub-1",state="disconnected"}`, "1", func(v float64) bool { return v == 1 })
	time.Sleep(2 * time.Second) // a few of the controller's state looks (every second)
	eventuallyMCS(t, e, ns, "web", "edge-o's objects kept with the hub cut", imported)
	if !edge.Running() {
		t.Fatal("the edge's controller exited")
	}
}
