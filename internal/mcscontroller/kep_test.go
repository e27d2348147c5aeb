package mcscontroller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Two behaviours of KEP-1645 through the controller: exports of one
// service with different port sets give the import their union and the
// local ServiceExport Conflict=True (PortConflict) naming what differs; a
// Headless import carries the IP families of its endpoints.
func TestPortUnionConflictAndHeadlessFamilies(t *testing.T) {
	se := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": exportsGVR.GroupVersion().String(), "kind": "ServiceExport",
			"metadata": map[string]any{"namespace": "ns", "name": name},
		}}
	}
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, se("web"), se("db"))
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	wide := exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP)
	wide.Exports[0].Ports = append(wide.Exports[0].Ports, annotation.Port{Name: "metrics", Port: 9090, TargetPort: 9090, Protocol: "TCP"})
	e.table.Upsert(wide)
	e.table.Upsert(exporter("a", "db", "10.0.0.2", annotation.TypeHeadless))
	v6 := exporter("b", "db", "fd00::2", annotation.TypeHeadless)
	v6.IPs = append(v6.IPs, netip.MustParseAddr("127.0.0.1")) // refused: no family of its own
	e.table.Upsert(v6)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}

	ports, _, _ := unstructured.NestedSlice(e.serviceImport("web").Object, "spec", "ports")
	var names []string
	for _, p := range ports {
		names = append(names, fmt.Sprint(p.(map[string]any)["name"]))
	}
	if !slices.Equal(names, []string{"http", "metrics"}) {
		t.Errorf("web's import ports %v, want the union http, metrics", names)
	}
	u, err := e.dyn.Resource(exportsGVR).Namespace("ns").Get(e.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(u, "Conflict"); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "PortConflict" ||
		!strings.Contains(c.Message, "cluster a does not export metrics 9090/TCP") {
		t.Errorf("web's Conflict condition: %+v", c)
	}

	fams, _, _ := unstructured.NestedStringSlice(e.serviceImport("db").Object, "spec", "ipFamilies")
	if !slices.Equal(fams, []string{"IPv4", "IPv6"}) {
		t.Errorf("db's (Headless) ipFamilies %v, want IPv4, IPv6", fams)
	}
	if ips, _, _ := unstructured.NestedStringSlice(e.serviceImport("db").Object, "spec", "ips"); len(ips) > 0 {
		t.Errorf("db's (Headless) ips %v", ips)
	}
}
