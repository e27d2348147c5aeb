package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// apiserverWatches is the number of watches of resource (core group) open
// on c's API server now, from its apiserver_longrunning_requests gauge.
func apiserverWatches(c *harness.Cluster, resource string) (int, error) {
	cx, cancel := ctxTimeout()
	defer cancel()
	body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(cx)
	if err != nil {
		return 0, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	f := fams["apiserver_longrunning_requests"]
	if f == nil {
		return 0, fmt.Errorf("the API server exports no apiserver_longrunning_requests")
	}
	n := 0
	for _, m := range f.GetMetric() {
		l := labelsOf(m)
		if l["verb"] == "WATCH" && l["resource"] == resource && l["group"] == "" && l["subresource"] == "" {
			n += int(m.GetGauge().GetValue())
		}
	}
	return n, nil
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// TestAnnotatorOneLocalPodWatch: mcs-annotator with -mcs-controller
// watches the local Pods once (the API server's own count of open watches
// of Pods), and that one watch serves both the annotator (it annotates a
// Pod created after the start) and the MCS controller (the Pod's address
// reaches the EndpointSlice of the local cluster's share, and a Pod that
// turns not ready turns its endpoint not ready).
func TestAnnotatorOneLocalPodWatch(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "one-watch"
	c := mcsClusters(t, ns, "edge-a")[0]
	app := map[string]string{"app": "web"}
	c.CreateService(t, harness.ServiceObject(ns, "web", app, tcpPort("http", 80, intstr.FromInt32(8080))))
	c.CreateServiceExport(t, "v1beta1", ns, "web")
	plainPod(t, c, ns, "web-1", "10.244.1.1", app)
	// The API server watches Pods itself: what the annotator opens is
	// counted above that.
	before, err := apiserverWatches(c, "pods")
	if err != nil {
		t.Fatal(err)
	}
	startAnnotator(t, c, "--leader-elect=false", "-mcs-controller")

	eventuallyMCS(t, c, ns, "web", "the local Pod in the import", func(v mcsView) error {
		if got := v.addrsBy()[clusterID]; !slices.Equal(got, []string{"10.244.1.1"}) {
			return fmt.Errorf("local endpoints %v", got)
		}
		return nil
	})
	// A Pod created now: annotated, then in the slices.
	plainPod(t, c, ns, "web-2", "10.244.1.2", app)
	eventuallyMCS(t, c, ns, "web", "the new Pod in the import", func(v mcsView) error {
		if got := v.addrsBy()[clusterID]; !slices.Equal(got, []string{"10.244.1.1", "10.244.1.2"}) {
			return fmt.Errorf("local endpoints %v", got)
		}
		return nil
	})
	// Readiness, which the annotator does not read, still reaches the
	// controller through the annotator's informer.
	c.SetPodReady(t, ns, "web-1", false, "10.244.1.1")
	eventuallyMCS(t, c, ns, "web", "web-1 not ready", func(v mcsView) error {
		for _, s := range v.slices {
			for _, e := range s.Endpoints {
				if slices.Contains(e.Addresses, "10.244.1.1") && e.Conditions.Ready != nil && !*e.Conditions.Ready {
					return nil
				}
			}
		}
		return fmt.Errorf("web-1 not marked not ready")
	})

	// One watch of Pods more than before the start, the annotator's, now
	// and a while later (nothing else in this cluster watches Pods: no
	// kubelet, no controller manager).
	harness.Eventually(t, 30*time.Second, func() error {
		n, err := apiserverWatches(c, "pods")
		if err == nil && n-before != 1 {
			err = fmt.Errorf("the annotator has %d watches of Pods open, want 1", n-before)
		}
		return err
	})
	harness.Consistently(t, 5*time.Second, time.Second, func() error {
		n, err := apiserverWatches(c, "pods")
		if err == nil && n-before > 1 {
			err = fmt.Errorf("the annotator has %d watches of Pods open, want 1", n-before)
		}
		return err
	})
}
