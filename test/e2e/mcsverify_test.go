package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestMCSControllerVerify: with a signing annotator and -verify, a tenant's
// hand-written, unsigned export annotation (claiming an exported service and
// a service nobody exports) reaches no object of the MCS controller: web's
// EndpointSlices hold only the Pod the annotator signed, no ServiceImport
// appears for the claimed service, and the refusal is counted.
func TestMCSControllerVerify(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "mcs-verify"
	a := mcsClusters(t, ns, "edge-a")[0]
	keys := newSigningKeyPair(t, "edge-a")
	web := map[string]string{"app": "web"}
	createSignedTestService(t, a, ns, "web", web)
	plainPod(t, a, ns, "web-1", "10.244.1.1", web)
	entry := func(name string) string {
		return fmt.Sprintf(`{"name":%q,"namespace":%q,"cluster":"edge-a","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}`, name, ns)
	}
	createSigningPod(t, a, ns, "tenant", "10.244.9.9",
		map[string]string{annotation.ExporterLabel: "true"},
		map[string]string{annotation.ExportAnnotation: `{"services":[` + entry("web") + "," + entry("payments") + `]}`})

	ctl := startAnnotator(t, a, "--cluster", "edge-a", "--sign-key", keys.PrivatePath, "--leader-elect=false",
		"-mcs-controller", "-verify", keys.Dir)
	eventuallyMCS(t, a, ns, "web", "only the signed Pod in web's slices", func(v mcsView) error {
		if v.imp == nil {
			return fmt.Errorf("no ServiceImport")
		}
		if got := v.addrsBy()["edge-a"]; !slices.Equal(got, []string{"10.244.1.1"}) {
			return fmt.Errorf("edge-a's endpoints %v, want only the signed Pod's 10.244.1.1", got)
		}
		return nil
	})
	eventuallyMetric(t, ctl, "mcs_controller_rejected_annotations_total", "at least one refusal", func(v float64) bool { return v >= 1 })
	// web converged after the tenant's Pod was read: a payments import, if
	// the controller took the unsigned entry, would be written by now; look
	// a little longer to be sure it never comes.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		v, err := readMCS(a, ns, "payments")
		if err != nil && !strings.Contains(err.Error(), "not found") {
			t.Fatal(err)
		}
		if v.imp != nil || len(v.slices) > 0 {
			t.Fatalf("payments: %v: the controller used an unsigned annotation", v)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
