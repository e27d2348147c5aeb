package e2e

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestMCSControllerSnapshotRestart: the MCS controller of edge-a with
// --snapshot-dir, reading peer edge-b through a link the test cuts. It is
// stopped while edge-b is cut, one of edge-b's EndpointSlices gets an extra
// address on the API server meanwhile (its annotations kept), and it starts
// again, still cut: edge-b's endpoints are exactly what they were (the extra
// address is gone: the share comes from the snapshot's records, never from
// the slices), and the import stays as it was. The same under --verify, with
// every cluster signing.
func TestMCSControllerSnapshotRestart(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprint("verify=", verify), func(t *testing.T) { testSnapshotRestart(t, verify) })
	}
}

func testSnapshotRestart(t *testing.T, verify bool) {
	ns := "mcs-snap"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	web := map[string]string{"app": "web"}
	createSignedTestService(t, a, ns, "web", web)
	createSignedTestService(t, b, ns, "web", web)
	plainPod(t, a, ns, "web-a1", "10.244.1.1", web)
	plainPod(t, b, ns, "web-b1", "10.244.2.1", web)
	plainPod(t, b, ns, "web-b2", "10.244.2.2", web)
	var signA, signB, verifyArgs []string
	if verify {
		ka, kb := newSigningKeyPair(t, "edge-a"), newSigningKeyPair(t, "edge-b")
		trustKey(t, kb, "edge-b", ka)
		signA, signB, verifyArgs = []string{"--sign-key", ka.PrivatePath}, []string{"--sign-key", kb.PrivatePath}, []string{"-verify", ka.Dir}
	}
	startAnnotator(t, b, append([]string{"--cluster", "edge-b", "--leader-elect=false"}, signB...)...)
	peer := harness.StartProxy(t, b.APIServerAddr())
	args := []string{"--cluster", "edge-a", "--leader-elect=false", "-mcs-controller", "-peer", "edge-b=" + b.KubeconfigVia(t, peer),
		"--snapshot-dir", t.TempDir()}
	args = append(append(args, signA...), verifyArgs...)
	ctl := startAnnotator(t, a, args...)

	want := map[string][]string{"edge-a": {"10.244.1.1"}, "edge-b": {"10.244.2.1", "10.244.2.2"}}
	exact := func(v mcsView) error {
		switch {
		case v.imp == nil:
			return fmt.Errorf("no ServiceImport")
		case len(v.imp.Status.Clusters) != 2:
			return fmt.Errorf("clusters %v", v.imp.Status.Clusters)
		}
		got := v.addrsBy()
		for cl, w := range want {
			if !slices.Equal(got[cl], w) {
				return fmt.Errorf("endpoints by cluster %v, want %v", got, want)
			}
		}
		return nil
	}
	before := eventuallyMCS(t, a, ns, "web", "the import of both clusters", exact).String()

	// edge-b is cut; the controller stops (it writes its snapshot out).
	peer.Cut(t)
	eventuallyMetric(t, ctl, `mcs_controller_cluster_last_contact_seconds{cluster="edge-b"}`, "edge-b out of contact", func(v float64) bool { return v > 1 })
	ctl.Kill(t, syscall.SIGTERM)

	// Meanwhile someone who may write EndpointSlices adds an address to
	// one of edge-b's, keeping its annotations.
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := a.Client.DiscoveryV1().EndpointSlices(ns).List(cx, metav1.ListOptions{LabelSelector: mcsv1beta1.LabelSourceCluster + "=edge-b"})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("edge-b's slices: %v (%v)", list, err)
	}
	s := list.Items[0]
	extra := *s.Endpoints[0].DeepCopy()
	extra.Addresses = []string{"10.244.2.99"}
	s.Endpoints = append(s.Endpoints, extra)
	if _, err := a.Client.DiscoveryV1().EndpointSlices(ns).Update(cx, &s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := readMCS(a, ns, "web"); err != nil || !slices.Contains(v.addrsBy()["edge-b"], "10.244.2.99") {
		t.Fatalf("the tampered slice: %v (%v)", v, err)
	}

	// Started again while edge-b is still cut: the tampered slice is
	// written back from the restored records, and then stays as it was.
	ctl = startAnnotator(t, a, args...)
	eventuallyMCS(t, a, ns, "web", "edge-b's share exactly as before the restart", exact)
	// Once written back, a slice is not written again: what the API server
	// stores is what the controller compares (no write loop).
	const slicesOK = `mcs_controller_writes_total{kind="endpointslice",result="ok"}`
	eventuallyMetric(t, ctl, slicesOK, "the tampered slice written again", func(v float64) bool { return v >= 1 })
	settled := metric(t, ctl, slicesOK)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		v, err := readMCS(a, ns, "web")
		if err != nil {
			t.Fatal(err)
		}
		if got := v.String(); got != before {
			t.Fatalf("after the restart, edge-b cut: %s\nwas %s", got, before)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if v := metric(t, ctl, slicesOK); v != settled {
		t.Errorf("%v slice writes after the tampered one was written back, want none", v-settled)
	}
}
