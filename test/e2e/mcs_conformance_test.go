package e2e

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestMCSConformanceFields: the behaviour of the upstream mcs-api
// conformance suite's Required specs that TestMCSController does not check,
// through the real chain (a Service and its ServiceExport in edge-b, edge-b's
// annotator, the controller in edge-a reading edge-b as a peer): the
// ServiceImport's sessionAffinity and its config, internalTrafficPolicy,
// trafficDistribution and ports (an SCTP one included) are the exported
// Service's; only the labels and annotations the ServiceExport lists are
// carried; a headless export's ServiceImport never gets an IP.
func TestMCSConformanceFields(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	ns := "mcs-conformance"
	cs := mcsClusters(t, ns, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	props := harness.ServiceObject(ns, "props", app("props"), tcpPort("http", 80, intstr.FromInt32(8080)),
		corev1.ServicePort{Name: "stcp", Port: 142, Protocol: corev1.ProtocolSCTP, TargetPort: intstr.FromInt32(142)})
	props.Labels = map[string]string{"svc-label": "true"}
	props.Annotations = map[string]string{"svc-annotation": "true"}
	props.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	props.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	props.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
	props = b.CreateService(t, props) // with the API server's defaults (the affinity's timeout)
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": harness.MCSGroup + "/v1beta1", "kind": "ServiceExport",
		"metadata": map[string]any{"namespace": ns, "name": "props"},
		"spec": map[string]any{
			"exportedLabels":      map[string]any{"dummy-label": "true"},
			"exportedAnnotations": map[string]any{"dummy-annotation": "true"},
		},
	}}
	cx, cancel := ctxTimeout()
	defer cancel()
	if _, err := b.Dynamic(t).Resource(harness.ServiceExportResource("v1beta1")).Namespace(ns).Create(cx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plainPod(t, b, ns, "props-b1", "10.244.2.1", app("props"))
	hl := harness.ServiceObject(ns, "hl", app("hl"), tcpPort("http", 80, intstr.FromInt32(8080)))
	hl.Spec.ClusterIP = corev1.ClusterIPNone
	b.CreateService(t, hl)
	b.CreateServiceExport(t, "v1beta1", ns, "hl")
	plainPod(t, b, ns, "hl-b1", "10.244.2.2", app("hl"))

	startAnnotator(t, b, "--cluster", "edge-b", "--leader-elect=false")
	startAnnotator(t, a, "--leader-elect=false", "-mcs-controller", "-peer", "edge-b="+b.Kubeconfig)

	var wantPorts []mcsv1beta1.ServicePort
	for _, p := range props.Spec.Ports {
		wantPorts = append(wantPorts, mcsv1beta1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, AppProtocol: p.AppProtocol})
	}
	byName := func(x, y mcsv1beta1.ServicePort) int { return cmp.Compare(x.Name, y.Name) }
	slices.SortFunc(wantPorts, byName)
	eventuallyMCS(t, a, ns, "props", "the exported Service's fields", func(v mcsView) error {
		if v.imp == nil {
			return fmt.Errorf("no ServiceImport")
		}
		s := v.imp.Spec
		ports := slices.Clone(s.Ports)
		slices.SortFunc(ports, byName)
		switch {
		case s.Type != mcsv1beta1.ClusterSetIP:
			return fmt.Errorf("type %s", s.Type)
		case s.SessionAffinity != props.Spec.SessionAffinity || !reflect.DeepEqual(s.SessionAffinityConfig, props.Spec.SessionAffinityConfig):
			return fmt.Errorf("sessionAffinity %s %v, want %s %v", s.SessionAffinity, s.SessionAffinityConfig, props.Spec.SessionAffinity, props.Spec.SessionAffinityConfig)
		case !reflect.DeepEqual(s.InternalTrafficPolicy, props.Spec.InternalTrafficPolicy):
			return fmt.Errorf("internalTrafficPolicy %v", ptr.Deref(s.InternalTrafficPolicy, "<nil>"))
		case !reflect.DeepEqual(s.TrafficDistribution, props.Spec.TrafficDistribution):
			return fmt.Errorf("trafficDistribution %v", ptr.Deref(s.TrafficDistribution, "<nil>"))
		case !reflect.DeepEqual(ports, wantPorts):
			return fmt.Errorf("ports %v, want %v", ports, wantPorts)
		case len(s.IPs) == 0:
			return fmt.Errorf("no ClusterSetIP")
		case v.imp.Labels["dummy-label"] != "true" || v.imp.Annotations["dummy-annotation"] != "true":
			return fmt.Errorf("labels %v, annotations %v: want those the ServiceExport lists", v.imp.Labels, v.imp.Annotations)
		case v.imp.Labels["svc-label"] != "" || v.imp.Annotations["svc-annotation"] != "":
			return fmt.Errorf("labels %v, annotations %v: the Service's own are carried", v.imp.Labels, v.imp.Annotations)
		}
		if _, err := netip.ParseAddr(s.IPs[0]); err != nil {
			return err
		}
		return nil
	})
	eventuallyMCS(t, a, ns, "hl", "a Headless import", func(v mcsView) error {
		if v.imp == nil || v.imp.Spec.Type != mcsv1beta1.Headless {
			return fmt.Errorf("want a Headless ServiceImport")
		}
		return nil
	})
	for range 5 { // the suite looks for an IP for 5 s
		v, err := readMCS(a, ns, "hl")
		if err != nil {
			t.Fatal(err)
		}
		if v.imp == nil || len(v.imp.Spec.IPs) > 0 || v.derived != nil {
			t.Fatalf("a headless import: %v", v)
		}
		time.Sleep(time.Second)
	}
}
