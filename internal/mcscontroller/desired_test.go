package mcscontroller

import (
	"encoding/json"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

func entry(name string, typ string, ports ...annotation.Port) annotation.Export {
	return annotation.Export{Name: name, Namespace: "ns", Ports: ports, Service: annotation.Service{Type: typ}}
}

func pod(cluster, name, ip string, ready bool, exports ...annotation.Export) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: "ns", Exports: exports}, Name: name, Ready: ready}
	if ip != "" {
		p.IPs = []netip.Addr{netip.MustParseAddr(ip)}
	}
	return p
}

func TestShares(t *testing.T) {
	http := annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
	web := entry("web", annotation.TypeClusterSetIP, http)
	webOld := entry("web", annotation.TypeHeadless, http) // a Pod not rewritten yet
	got := shares([]*store.Pod{
		pod("b", "web-2", "10.0.0.2", false, web),
		pod("b", "web-1", "10.0.0.1", true, webOld),
		pod("a", "web-9", "10.1.0.9", true, web, entry("db", "")),
		pod("a", "pending", "", true, web), // no IP yet: no endpoint, but its entry counts
	})
	w := got[clusterset.Key{Namespace: "ns", Name: "web"}]
	if len(w) != 2 || len(w["a"].endpoints) != 1 || len(w["b"].endpoints) != 2 {
		t.Fatalf("web: %+v", w)
	}
	if w["b"].entry.Type != annotation.TypeHeadless {
		t.Errorf("cluster b's entry is %q: want the first Pod by name's (web-1)", w["b"].entry.Type)
	}
	ep := w["b"].endpoints[1]
	if ep.Ready || ep.Serving || ep.Hostname != "10-0-0-2" || len(ep.Ports) != 1 || ep.Ports[0].Port != 8080 {
		t.Errorf("web-2's endpoint %+v", ep)
	}
	if d := got[clusterset.Key{Namespace: "ns", Name: "db"}]; len(d) != 1 || len(d["a"].endpoints) != 1 {
		t.Errorf("db: %+v", d)
	}
}

func TestToExport(t *testing.T) {
	e := annotation.Export{Name: "web", Namespace: "ns",
		Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP", AppProtocol: "http"}},
		Service: annotation.Service{Type: annotation.TypeClusterSetIP, ExportedAt: "2026-11-25T12:00:00Z",
			SessionAffinity: "ClientIP", SessionAffinityTimeoutSeconds: 30, InternalTrafficPolicy: "Local",
			Labels: map[string]string{"a": "b"}}}
	x := toExport("edge-a", &e)
	if x.Cluster != "edge-a" || x.Type != mcsv1beta1.ClusterSetIP || x.Created.IsZero() ||
		x.SessionAffinity != corev1.ServiceAffinityClientIP || *x.SessionAffinityConfig.ClientIP.TimeoutSeconds != 30 ||
		*x.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal || x.TrafficDistribution != nil ||
		x.Labels["a"] != "b" || len(x.Ports) != 1 || x.Ports[0].Port != 80 || *x.Ports[0].AppProtocol != "http" {
		t.Errorf("%+v", x)
	}
	old := toExport("edge-a", &annotation.Export{Name: "web", Namespace: "ns"})
	if old.Type != mcsv1beta1.Headless || old.SessionAffinityConfig != nil || old.InternalTrafficPolicy != nil {
		t.Errorf("an entry written before the Service fields: %+v", old)
	}
}

// heldSlices groups the slices of the clusters whose share is not known by
// service and cluster, whatever their annotations say.
func TestHeldSlices(t *testing.T) {
	e := entry("db", annotation.TypeClusterSetIP)
	raw, _ := json.Marshal(e)
	slice := func(name, cluster, svc, ann string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Labels:      map[string]string{mcsv1beta1.LabelSourceCluster: cluster, mcsv1beta1.LabelServiceName: svc},
			Annotations: map[string]string{AnnotationExport: ann}}}
	}
	got := heldSlices([]*discoveryv1.EndpointSlice{
		slice("web-1", "b", "web", string(raw)),
		slice("web-2", "b", "web", "not json"),  // held all the same
		slice("web-3", "a", "web", string(raw)), // a is current: not held
		slice("db-1", "b", "db", ""),
	}, func(c string) bool { return c == "b" })
	w := got[clusterset.Key{Namespace: "ns", Name: "web"}]
	if len(w) != 1 || len(w["b"]) != 2 {
		t.Errorf("web: %+v", w)
	}
	if d := got[clusterset.Key{Namespace: "ns", Name: "db"}]; len(d) != 1 || len(d["b"]) != 1 {
		t.Errorf("db: %+v", d)
	}
}
