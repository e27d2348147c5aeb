package e2e

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// mcsExpire is the controller's --peer-expire in TestMCSPeerExpiry.
const mcsExpire = 12 * time.Second

// mcsContactLag bounds how long before a cut the controller may have last
// heard from the peer: the source checks its API server every 5 s, and a
// check may be under way.
const mcsContactLag = 6 * time.Second

// TestMCSPeerExpiry: two real clusters; the real controller in edge-a
// (bin/mcs-annotator --mcs-controller --peer-expire) reads edge-b through a
// link the test cuts. edge-b exports web (also exported by edge-a) and db
// (edge-b alone). While cut and within the expiry, every object is as it
// was; past it, edge-b's slices and its place in web's ServiceImport go and
// db's ServiceImport is deleted; when the link returns, edge-b's share comes
// back. A controller restarted while the peer is cut counts the expiry from
// its own start (it does not know when the peer last answered its
// predecessor), so the share outlives the expiry counted from the cut;
// meanwhile it holds edge-b's share alone, and edge-a's changes land.
func TestMCSPeerExpiry(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "mcs-expiry"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	http := tcpPort("http", 80, intstr.FromInt32(8080))
	a.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http))
	a.CreateServiceExport(t, "v1beta1", ns, "web")
	plainPod(t, a, ns, "web-a1", "10.244.1.1", app("web"))
	b.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http))
	b.CreateService(t, harness.ServiceObject(ns, "db", app("db"), tcpPort("pg", 5432, intstr.FromInt32(5432))))
	b.CreateServiceExport(t, "v1beta1", ns, "web")
	b.CreateServiceExport(t, "v1beta1", ns, "db")
	plainPod(t, b, ns, "web-b1", "10.244.2.1", app("web"))
	plainPod(t, b, ns, "db-b1", "10.244.2.2", app("db"))
	startAnnotator(t, b, "--cluster", "edge-b", "--leader-elect=false")
	peer := harness.StartProxy(t, b.APIServerAddr())
	args := []string{"--leader-elect=false", "-mcs-controller", "-peer", "edge-b=" + b.KubeconfigVia(t, peer), "-peer-expire", mcsExpire.String()}
	ctl := startAnnotator(t, a, args...)

	// aIPs are edge-a's endpoints of web, sorted.
	aIPs := []string{"10.244.1.1"}
	withB := func(what string) {
		t.Helper()
		eventuallyMCS(t, a, ns, "web", what+": the import of edge-a and edge-b", func(v mcsView) error {
			if v.imp == nil || !slices.Equal(clustersOf(v.imp), []string{"edge-a", "edge-b"}) || len(v.imp.Spec.IPs) == 0 {
				return fmt.Errorf("want both clusters and a ClusterSetIP")
			}
			if got := v.addrsBy(); !slices.Equal(got["edge-a"], aIPs) || !slices.Equal(got["edge-b"], []string{"10.244.2.1"}) {
				return fmt.Errorf("endpoints by cluster %v", got)
			}
			return nil
		})
		eventuallyMCS(t, a, ns, "db", what+": the import of edge-b", func(v mcsView) error {
			if v.imp == nil || !slices.Equal(clustersOf(v.imp), []string{"edge-b"}) || len(v.imp.Spec.Ports) != 1 || !slices.Equal(v.addrsBy()["edge-b"], []string{"10.244.2.2"}) {
				return fmt.Errorf("want edge-b's share")
			}
			return nil
		})
	}
	withoutB := func(what string) {
		t.Helper()
		eventuallyMCS(t, a, ns, "web", what+": web keeps edge-a's share alone", func(v mcsView) error {
			if v.imp == nil || !slices.Equal(clustersOf(v.imp), []string{"edge-a"}) {
				return fmt.Errorf("want edge-a alone")
			}
			if got := v.addrsBy(); len(got["edge-b"]) > 0 || !slices.Equal(got["edge-a"], aIPs) {
				return fmt.Errorf("endpoints by cluster %v", got)
			}
			return nil
		})
		eventuallyMCS(t, a, ns, "db", what+": db's import deleted", func(v mcsView) error {
			if v.imp != nil || len(v.slices) > 0 {
				return fmt.Errorf("still there")
			}
			return nil
		})
	}
	view := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, n := range []string{"web", "db"} {
			v, err := readMCS(a, ns, n)
			if err != nil {
				t.Fatal(err)
			}
			out[n] = v.String()
		}
		return out
	}
	// unchanged checks until the given time that every object is as before.
	unchanged := func(when string, before map[string]string, until time.Time) {
		t.Helper()
		for {
			for n, v := range view() {
				if v != before[n] {
					t.Fatalf("%s: %s changed:\n%s\nwas\n%s", when, n, v, before[n])
				}
			}
			if time.Now().After(until) {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	withB("connected")
	before := view()
	cut := time.Now()
	peer.Cut(t)
	unchanged("cut, within the expiry", before, cut.Add(mcsExpire-mcsContactLag))
	withoutB("past the expiry")
	peer.Restore(t)
	withB("restored")

	// Cut again; the controller restarts halfway through the expiry. Its
	// expiry counts from its start, so the share stays past the cut's.
	before = view()
	cut = time.Now()
	peer.Cut(t)
	unchanged("cut again, before the restart", before, cut.Add(mcsExpire/2))
	ctl.Kill(t, syscall.SIGTERM)
	restart := time.Now()
	ctl = startAnnotator(t, a, args...)
	eventuallyMetric(t, ctl, "mcs_controller_reconcile_seconds_count", "> 0", func(v float64) bool { return v > 0 })
	// Without a snapshot the restarted controller holds edge-b's slices
	// only: a change of edge-a, whose API server it reads, lands meanwhile
	// (the hold is per cluster, not per service), beside edge-b's held
	// share.
	unchanged("restarted while cut, before edge-a's change", before, restart.Add(mcsExpire/4))
	plainPod(t, a, ns, "web-a2", "10.244.1.2", app("web"))
	aIPs = []string{"10.244.1.1", "10.244.1.2"}
	withB("restarted while cut, edge-a's new endpoint")
	if since := time.Since(restart); since >= mcsExpire-time.Second {
		t.Fatalf("edge-a's change landed %v after the restart, not within the expiry (%v): edge-b's share was not checked as held", since, mcsExpire)
	}
	withoutB("restarted while cut, past the expiry")
	peer.Restore(t)
	withB("restored after the restart")
}

// clustersOf are the clusters of a ServiceImport's status, in order.
func clustersOf(im *mcsv1beta1.ServiceImport) []string {
	var out []string
	for _, c := range im.Status.Clusters {
		out = append(out, c.Cluster)
	}
	return out
}
