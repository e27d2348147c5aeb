package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestMCSPortUnionAndHeadlessFamilies: two real clusters, each running the
// real annotator with the MCS controller and the other as its peer.
//
//   - web is exported by edge-a with http and by edge-b with http and
//     metrics: each cluster's ServiceImport has the union, and each cluster's
//     controller sets Conflict=True (PortConflict) on its own ServiceExport,
//     the message naming the port edge-a lacks (KEP-1645, "Service Port"),
//     and records a Warning Event saying it on the ServiceExport and on the
//     ServiceImport.
//   - db is Headless, its Pods IPv4 in edge-a and IPv6 in edge-b, its
//     Services IPv4 (the API servers are single-stack IPv4): each
//     ServiceImport carries spec.ipFamilies IPv4, the exported Services'
//     families, not the addresses' (and no IP); the annotator writes them
//     into the entries.
func TestMCSPortUnionAndHeadlessFamilies(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "mcs-kep"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	http := tcpPort("http", 80, intstr.FromInt32(8080))
	metrics := tcpPort("metrics", 9090, intstr.FromInt32(9090))
	headless := func() *corev1.Service {
		s := harness.ServiceObject(ns, "db", app("db"), tcpPort("pg", 5432, intstr.FromInt32(5432)))
		s.Spec.ClusterIP = corev1.ClusterIPNone
		return s
	}

	a.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http))
	a.CreateService(t, headless())
	b.CreateService(t, harness.ServiceObject(ns, "web", app("web"), http, metrics))
	b.CreateService(t, headless())
	for _, c := range cs {
		c.CreateServiceExport(t, "v1beta1", ns, "web")
		c.CreateServiceExport(t, "v1beta1", ns, "db")
	}
	plainPod(t, a, ns, "web-a1", "10.244.1.1", app("web"))
	plainPod(t, a, ns, "db-a1", "10.244.1.2", app("db"))
	plainPod(t, b, ns, "web-b1", "10.244.2.1", app("web"), containerPort("http", 8080), containerPort("metrics", 9090))
	plainPod(t, b, ns, "db-b1", "fd00:244:2::2", app("db"))
	startAnnotator(t, a, "--cluster", "edge-a", "--leader-elect=false", "-mcs-controller", "-peer", "edge-b="+b.Kubeconfig)
	startAnnotator(t, b, "--cluster", "edge-b", "--leader-elect=false", "-mcs-controller", "-peer", "edge-a="+a.Kubeconfig)

	for _, c := range cs {
		eventuallyMCS(t, c, ns, "web", "the union of the ports", func(v mcsView) error {
			if v.imp == nil {
				return fmt.Errorf("no ServiceImport")
			}
			var names []string
			for _, p := range v.imp.Spec.Ports {
				names = append(names, fmt.Sprintf("%s/%d", p.Name, p.Port))
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{"http/80", "metrics/9090"}) || len(v.imp.Status.Clusters) != 2 {
				return fmt.Errorf("ports %v, clusters %v: want http/80 and metrics/9090 of both", names, v.imp.Status.Clusters)
			}
			return nil
		})
		conds := wantConditions(t, c, ns, "web", cond{"Conflict", metav1.ConditionTrue, "PortConflict"})
		for _, cd := range conds {
			if cd.Type == "Conflict" && !strings.Contains(cd.Message, "cluster edge-a does not export metrics 9090/TCP") {
				t.Errorf("%s: the Conflict message %q does not name the difference", c.Name, cd.Message)
			}
		}

		// ... and a Warning Event on each, for kubectl describe.
		for _, kind := range []string{"ServiceExport", "ServiceImport"} {
			harness.Eventually(t, mcsPropagation, func() error {
				cx, cancel := ctxTimeout()
				defer cancel()
				evs, err := c.Client.CoreV1().Events(ns).List(cx, metav1.ListOptions{
					FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=web,reason=Conflict"})
				if err != nil {
					return err
				}
				for _, ev := range evs.Items {
					if ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.UID != "" && strings.Contains(ev.Message, "cluster edge-a does not export metrics 9090/TCP") {
						return nil
					}
				}
				return fmt.Errorf("%s: no Conflict event on the %s web naming the difference (%d events)", c.Name, kind, len(evs.Items))
			})
		}

		eventuallyMCS(t, c, ns, "db", "a Headless import with the Services' families", func(v mcsView) error {
			switch {
			case v.imp == nil:
				return fmt.Errorf("no ServiceImport")
			case v.imp.Spec.Type != mcsv1beta1.Headless || len(v.imp.Spec.IPs) > 0 || v.derived != nil:
				return fmt.Errorf("want a Headless import without IPs or a derived Service")
			case !slices.Equal(v.imp.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}):
				return fmt.Errorf("ipFamilies %v, want IPv4 (the Services'; the addresses are IPv4 and IPv6)", v.imp.Spec.IPFamilies)
			}
			return nil
		})
	}
	for _, p := range []struct {
		c   *harness.Cluster
		pod string
	}{{a, "db-a1"}, {b, "db-b1"}} {
		raw := p.c.GetPod(t, ns, p.pod).Annotations[harness.ExportAnnotation]
		got, rej := annotation.ParseExports(raw, ns, p.c.Name)
		if len(rej) > 0 || len(got) != 1 || !slices.Equal(got[0].IPFamilies.List(), []string{annotation.IPv4}) {
			t.Errorf("%s: Pod %s: export annotation %s (%v): want an entry with ipFamilies [IPv4]", p.c.Name, p.pod, raw, rej)
		}
	}
}
