package e2e

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// mcsStaleGrace is the grace of the "drop" service's stale policy in
// TestMCSStalePolicy.
const mcsStaleGrace = 15 * time.Second

// TestMCSStalePolicy: the exporter's stale policy applies to the
// controller's EndpointSlices as to CoreDNS's answers. Two real clusters;
// the real controller in edge-a reads edge-b through a link the test cuts.
// edge-b's Pods export "drop" (drop-after=15s) and "keep" (the default,
// serve); edge-a exports both too. Cut, both keep edge-b's endpoints
// within the grace; past it, drop's slices of edge-b go (edge-a's stay)
// while keep's stay, also after the controller restarts while edge-b is
// still cut; when the link returns, drop's come back.
func TestMCSStalePolicy(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "mcs-stale"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	for _, n := range []string{"drop", "keep"} {
		a.CreateService(t, harness.ServiceObject(ns, n, app(n), tcpPort("http", 80, intstr.FromInt32(8080))))
		a.CreateServiceExport(t, "v1beta1", ns, n)
	}
	plainPod(t, a, ns, "drop-a1", "10.244.1.1", app("drop"))
	plainPod(t, a, ns, "keep-a1", "10.244.1.2", app("keep"))
	drop := peerEntry(ns, "drop", annotation.TypeClusterSetIP, 80)
	drop.StaleEndpoints, drop.StaleGraceSeconds = annotation.StaleDrop, int32(mcsStaleGrace/time.Second)
	peerPod(t, b, ns, "drop-b1", "10.244.2.1", drop)
	peerPod(t, b, ns, "keep-b1", "10.244.2.2", peerEntry(ns, "keep", annotation.TypeClusterSetIP, 80))
	peer := harness.StartProxy(t, b.APIServerAddr())
	args := []string{"--leader-elect=false", "-mcs-controller", "-peer", "edge-b=" + b.KubeconfigVia(t, peer)}
	ctl := startAnnotator(t, a, args...)

	// shares checks the endpoints of a service's slices by cluster.
	shares := func(name string, want map[string][]string) func(mcsView) error {
		return func(v mcsView) error {
			got := v.addrsBy()
			for _, cl := range []string{"edge-a", "edge-b"} {
				if !slices.Equal(got[cl], want[cl]) {
					return fmt.Errorf("%s: endpoints by cluster %v, want %v", name, got, want)
				}
			}
			return nil
		}
	}
	both := map[string]map[string][]string{
		"drop": {"edge-a": {"10.244.1.1"}, "edge-b": {"10.244.2.1"}},
		"keep": {"edge-a": {"10.244.1.2"}, "edge-b": {"10.244.2.2"}},
	}
	withB := func(when string) {
		t.Helper()
		for _, n := range []string{"drop", "keep"} {
			eventuallyMCS(t, a, ns, n, when, shares(n, both[n]))
		}
	}
	withB("both clusters' endpoints")

	cut := time.Now()
	peer.Cut(t)
	for time.Now().Before(cut.Add(mcsStaleGrace - mcsContactLag)) {
		for _, n := range []string{"drop", "keep"} {
			v, err := readMCS(a, ns, n)
			if err == nil {
				err = shares(n, both[n])(v)
			}
			if err != nil {
				t.Fatalf("cut, within the grace: %v", err)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	eventuallyMCS(t, a, ns, "drop", "past the grace: edge-b's endpoints dropped", func(v mcsView) error {
		if err := shares("drop", map[string][]string{"edge-a": {"10.244.1.1"}})(v); err != nil {
			return err
		}
		if v.imp == nil || !slices.Equal(clustersOf(v.imp), []string{"edge-a"}) || len(v.imp.Spec.IPs) == 0 {
			return fmt.Errorf("want the import of edge-a alone, its ClusterSetIP kept")
		}
		return nil
	})
	if v, err := readMCS(a, ns, "keep"); err != nil || shares("keep", both["keep"])(v) != nil {
		t.Fatalf("past drop's grace, keep (serve) lost edge-b's endpoints: %v %v", v, err)
	}

	// The controller restarts while edge-b is still cut: without a snapshot
	// it holds edge-b's slices as they are (it does not know edge-b yet),
	// so keep keeps edge-b's endpoints and drop, which had none left, stays
	// without them.
	ctl.Kill(t, syscall.SIGTERM)
	ctl = startAnnotator(t, a, args...)
	eventuallyMetric(t, ctl, "mcs_controller_reconcile_seconds_count", "> 0", func(v float64) bool { return v > 0 })
	for _, n := range []string{"drop", "keep"} {
		want := both[n]
		if n == "drop" {
			want = map[string][]string{"edge-a": {"10.244.1.1"}}
		}
		v, err := readMCS(a, ns, n)
		if err == nil {
			err = shares(n, want)(v)
		}
		if err != nil {
			t.Fatalf("restarted while cut: %v", err)
		}
	}

	peer.Restore(t)
	withB("in contact again: edge-b's endpoints back")
}
