package soak

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// verdictModel is a model where vip-0 and svc-0 have in edge-a the set
// 10.1.0.1,10.1.0.2 since faultEnd and had 10.1.0.1 until 10 s before, and
// in edge-b 10.2.0.1; the last fault that touched each scope ended at
// faultEnd.
func verdictModel(faultEnd time.Time) *model {
	m := newModel()
	for _, svc := range []string{"vip-0", "svc-0"} {
		for k, sets := range map[part][]string{{svc, "edge-a"}: {"10.1.0.1", "10.1.0.1,10.1.0.2"}, {svc, "edge-b"}: {"10.2.0.1"}} {
			m.history[k], m.ended[k] = map[string]bool{}, map[string]time.Time{}
			for i, s := range sets {
				m.history[k][s] = true
				if i < len(sets)-1 {
					m.ended[k][s] = faultEnd.Add(-10 * time.Second)
				}
				m.current[k] = s
			}
			m.since[k] = faultEnd
		}
	}
	for _, scope := range []string{dnsA, dnsB, mcsA, mcsB} {
		m.faultEnd[scope], m.lastFault[scope] = faultEnd, "a fault"
	}
	return m
}

// verdictObjects are the objects the controller should keep for svc when
// its model is verdictModel's, with the ClusterSetIP 10.96.0.10 for vip-N.
func verdictObjects(svc string) mcsObjects {
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: svc, UID: types.UID("import-" + svc)},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.Headless,
			Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
		Status: mcsv1beta1.ServiceImportStatus{Clusters: []mcsv1beta1.ClusterStatus{{Cluster: "edge-a"}, {Cluster: "edge-b"}}},
	}
	o := mcsObjects{imports: map[string]*mcsv1beta1.ServiceImport{svc: si}, slices: map[string][]discoveryv1.EndpointSlice{}}
	labels := func(cl string) map[string]string {
		return map[string]string{mcsv1beta1.LabelServiceName: svc, mcsv1beta1.LabelSourceCluster: cl}
	}
	if isClusterSetIP(svc) {
		si.Spec.Type, si.Spec.IPs = mcsv1beta1.ClusterSetIP, []string{"10.96.0.10"}
		o.services = []corev1.Service{{
			ObjectMeta: metav1.ObjectMeta{Name: svc + "-mcs-1", OwnerReferences: []metav1.OwnerReference{{UID: si.UID}}},
			Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}},
		}}
		labels = func(cl string) map[string]string {
			return map[string]string{mcsv1beta1.LabelServiceName: svc, mcsv1beta1.LabelSourceCluster: cl, discoveryv1.LabelServiceName: svc + "-mcs-1"}
		}
	}
	ep := func(ip string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
	}
	o.slices[svc] = []discoveryv1.EndpointSlice{
		{ObjectMeta: metav1.ObjectMeta{Name: svc + "-a", Labels: labels("edge-a")}, Endpoints: []discoveryv1.Endpoint{ep("10.1.0.2", true), ep("10.1.0.1", true), ep("10.1.0.3", false)}},
		{ObjectMeta: metav1.ObjectMeta{Name: svc + "-b", Labels: labels("edge-b")}, Endpoints: []discoveryv1.Endpoint{ep("10.2.0.1", true)}},
	}
	return o
}

// TestMCSVerdict: the soak's check of the MCS objects finds each kind of
// wrong, missing and stale object, and only those.
func TestMCSVerdict(t *testing.T) {
	vips := []string{"10.96.0.10"}
	for _, tc := range []struct {
		name, svc string
		change    func(o *mcsObjects)
		want      string // verdict
		why       string // in the reason, for wrong and missing
	}{
		{"as it should be", "vip-0", func(*mcsObjects) {}, "ok", ""},
		{"a headless service as it should be", "svc-0", func(*mcsObjects) {}, "ok", ""},
		{"an earlier set of edge-a's", "vip-0", func(o *mcsObjects) { o.slices["vip-0"][0].Endpoints[0].Conditions.Ready = ptr.To(false) }, "stale", ""},
		{"unknown readiness counts as ready", "svc-0", func(o *mcsObjects) { o.slices["svc-0"][0].Endpoints[0].Conditions.Ready = nil }, "ok", ""},
		{"an address the service never had", "vip-0", func(o *mcsObjects) { o.slices["vip-0"][1].Endpoints[0].Addresses = []string{"10.2.9.9"} }, "wrong", "never had"},
		{"edge-b's address in edge-a's slice", "svc-0", func(o *mcsObjects) { o.slices["svc-0"][0].Endpoints[2] = readyEndpoint("10.2.0.1") }, "wrong", "never had"},
		{"the ClusterSetIP changed", "vip-0", func(o *mcsObjects) {
			o.imports["vip-0"].Spec.IPs = []string{"10.96.0.11"}
			o.services[0].Spec.ClusterIPs = []string{"10.96.0.11"}
		}, "wrong", "was [10.96.0.10]"},
		{"the derived Service's ClusterIP differs", "vip-0", func(o *mcsObjects) { o.services[0].Spec.ClusterIPs = []string{"10.96.0.12"} }, "wrong", "ClusterIPs"},
		{"two derived Services", "vip-0", func(o *mcsObjects) { o.services = append(o.services, o.services[0]) }, "wrong", "2 derived"},
		{"a ClusterSetIP service imported Headless", "vip-0", func(o *mcsObjects) { o.imports["vip-0"].Spec.Type = mcsv1beta1.Headless }, "wrong", "type"},
		{"a headless service with a derived Service", "svc-0", func(o *mcsObjects) {
			o.services = []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "svc-0-mcs-1", OwnerReferences: []metav1.OwnerReference{{UID: o.imports["svc-0"].UID}}}}}
		}, "wrong", "derived"},
		{"another import's derived Service is not this one's", "svc-0", func(o *mcsObjects) { o.services = verdictObjects("vip-0").services }, "ok", ""},
		{"another port", "svc-0", func(o *mcsObjects) { o.imports["svc-0"].Spec.Ports[0].Port = 81 }, "wrong", "ports"},
		{"a cluster that does not exist", "svc-0", func(o *mcsObjects) { o.slices["svc-0"][1].Labels[mcsv1beta1.LabelSourceCluster] = "edge-z" }, "wrong", "edge-z"},
		{"a slice naming no derived Service", "vip-0", func(o *mcsObjects) { delete(o.slices["vip-0"][0].Labels, discoveryv1.LabelServiceName) }, "wrong", "names Service"},
		{"no ServiceImport", "vip-0", func(o *mcsObjects) { delete(o.imports, "vip-0") }, "missing", "no ServiceImport"},
		{"no ClusterSetIP yet", "vip-0", func(o *mcsObjects) { o.imports["vip-0"].Spec.IPs = nil }, "missing", "no ClusterSetIP"},
		{"no derived Service", "vip-0", func(o *mcsObjects) { o.services = nil }, "missing", "no derived Service"},
		{"no slice of edge-b", "svc-0", func(o *mcsObjects) { o.slices["svc-0"] = o.slices["svc-0"][:1] }, "missing", "edge-b"},
		{"edge-b not in the import's clusters", "svc-0", func(o *mcsObjects) { o.imports["svc-0"].Status.Clusters = o.imports["svc-0"].Status.Clusters[:1] }, "missing", "edge-b not in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			m := verdictModel(now.Add(-30 * time.Second))
			o := verdictObjects(tc.svc)
			tc.change(&o)
			var ips []string
			if isClusterSetIP(tc.svc) {
				ips = vips
			}
			got := m.mcsVerdict(tc.svc, ips, o, now)
			if got.v != tc.want || !strings.Contains(got.why, tc.why) {
				t.Fatalf("%s %q, want %s with %q", got.v, got.why, tc.want, tc.why)
			}
			switch got.v {
			case "stale": // from when the set shown stopped being current, 40 s ago
				if got.stale != 40*time.Second || got.after != 30*time.Second {
					t.Errorf("staleness %v, after recovery %v, want 40s and 30s", got.stale, got.after)
				}
			case "missing":
				if got.after != 30*time.Second {
					t.Errorf("missing %v after the last fault, want 30s", got.after)
				}
			}
		})
	}
}

// TestMCSVerdictDuringFault: while a fault that touches the objects is on, a
// missing or stale object has no time after recovery.
func TestMCSVerdictDuringFault(t *testing.T) {
	now := time.Now()
	m := verdictModel(now.Add(-30 * time.Second))
	m.inFault[mcsB] = true
	o := verdictObjects("svc-0")
	o.slices["svc-0"] = o.slices["svc-0"][:1]
	if got := m.mcsVerdict("svc-0", nil, o, now); got.v != "missing" || got.after != -1 {
		t.Errorf("edge-b's slice gone during a fault of edge-b: %s after %v, want missing with -1", got.v, got.after)
	}
	o = verdictObjects("svc-0")
	o.slices["svc-0"][0].Endpoints[0].Conditions.Ready = ptr.To(false)
	if got := m.mcsVerdict("svc-0", nil, o, now); got.v != "stale" || got.after != 30*time.Second {
		t.Errorf("edge-a's part stale during a fault of edge-b: %s after %v, want stale 30s after", got.v, got.after)
	}
}

func readyEndpoint(ip string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
}

// TestSettleEnds: a set ends when the part settles on another, and so does
// each set a write was expected to pass through; the current set has no end.
func TestSettleEnds(t *testing.T) {
	m := newModel()
	k := part{"svc-0", "edge-a"}
	m.pods["edge-a/a"] = &pod{cluster: "edge-a", name: "a", svc: "svc-0", ip: "10.1.0.1", ready: true}
	m.pods["edge-a/b"] = &pod{cluster: "edge-a", name: "b", svc: "svc-0", ip: "10.1.0.2", ready: true}
	m.settle(k)
	first := m.since[k]
	// A replacement of b: without b, then with c.
	delete(m.pods, "edge-a/b")
	m.expect(k)
	m.pods["edge-a/c"] = &pod{cluster: "edge-a", name: "c", svc: "svc-0", ip: "10.1.0.3", ready: true}
	m.settle(k)
	if m.current[k] != "10.1.0.1,10.1.0.3" {
		t.Fatalf("current %q", m.current[k])
	}
	for _, s := range []string{"10.1.0.1,10.1.0.2", "10.1.0.1"} {
		if e, ok := m.ended[k][s]; !ok || e.Before(first) || e != m.since[k] {
			t.Errorf("set %q ended at %v (%v), want when the current set began, %v", s, e, ok, m.since[k])
		}
	}
	if _, ok := m.ended[k][m.current[k]]; ok {
		t.Errorf("the current set has an end")
	}
}
