package mcscontroller

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/mcsannotations/mcsannotations/annotation"
)

func TestExportedFamilies(t *testing.T) {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	for _, tc := range []struct {
		name string
		in   []string
		want []corev1.IPFamily
	}{
		{"no entry says them", nil, nil},
		{"one", []string{"IPv6"}, []corev1.IPFamily{v6}},
		{"the union, IPv4 first", []string{"IPv6", "IPv6", "IPv4"}, []corev1.IPFamily{v4, v6}},
	} {
		if got := exportedFamilies(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%s: exportedFamilies(%v) = %v, want %v", tc.name, tc.in, got, tc.want)
		}
	}
}

// A Headless import's spec.ipFamilies are the exported Services' (the
// entries' ipFamilies), not the families of the endpoints' addresses; when
// no entry says them (an older annotator), they are the addresses'.
func TestHeadlessFamiliesFromServices(t *testing.T) {
	se := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": exportsGVR.GroupVersion().String(), "kind": "ServiceExport",
			"metadata": map[string]any{"namespace": "ns", "name": name},
		}}
	}
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, se("db"), se("old"))
	// db: both Services say IPv6, one Pod has an IPv4 address.
	for _, p := range []struct{ cluster, ip string }{{"a", "10.0.0.2"}, {"b", "fd00::2"}} {
		pod := exporter(p.cluster, "db", p.ip, annotation.TypeHeadless)
		pod.Exports[0].IPFamilies = annotation.NewIPFamilies(annotation.IPv6)
		e.table.Upsert(pod)
	}
	// old: written without ipFamilies.
	e.table.Upsert(exporter("a", "old", "10.0.0.3", annotation.TypeHeadless))
	e.table.Upsert(exporter("b", "old", "fd00::3", annotation.TypeHeadless))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{"db": {"IPv6"}, "old": {"IPv4", "IPv6"}} {
		fams, _, _ := unstructured.NestedStringSlice(e.serviceImport(name).Object, "spec", "ipFamilies")
		if !slices.Equal(fams, want) {
			t.Errorf("%s: ipFamilies %v, want %v", name, fams, want)
		}
	}
}
