package mcscontroller

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

var webKey = clusterset.Key{Namespace: "ns", Name: "web"}

// wantWeb is the job plan makes for web from these records (one per
// cluster), as the controller's outcome holds it.
func wantWeb(mode derivedMode, pods ...*store.Pod) job {
	cur := shares(pods)[webKey]
	var exports []clusterset.Export
	out := &outcome{}
	for cl, s := range cur {
		exports = append(exports, toExport(cl, &s.entry))
		out.clusters = append(out.clusters, cl)
	}
	im := clusterset.Merge(exports)
	out.merged = &im
	if mode == derivedKeep {
		out.service = "ns/" + clusterset.DerivedServiceName("web")
	}
	return job{k: webKey, im: &im, cur: cur, out: out, derived: mode}
}

// ours are objects a sync of web wrote before: its ServiceImport, derived
// Service and a slice of cluster z.
func ours() []runtime.Object {
	imp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": importsGVR.GroupVersion().String(), "kind": "ServiceImport",
		"metadata": map[string]any{"namespace": "ns", "name": "web", "labels": map[string]any{clusterset.LabelManagedBy: clusterset.ManagedBy}},
		"spec":     map[string]any{"type": "ClusterSetIP", "ips": []any{"10.96.9.9"}},
	}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: clusterset.DerivedServiceName("web"),
		Labels: map[string]string{clusterset.LabelManagedBy: clusterset.ManagedBy, mcsv1beta1.LabelServiceName: "web"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.9.9", ClusterIPs: []string{"10.96.9.9"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-old-0",
		Labels: clusterset.SliceLabels(webKey, "z", svc.Name)}, AddressType: discoveryv1.AddressTypeIPv4}
	return []runtime.Object{imp, svc, sl}
}

func webExport() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": exportsGVR.GroupVersion().String(), "kind": "ServiceExport",
		"metadata": map[string]any{"namespace": "ns", "name": "web"},
	}}
}

// The sync of one service, table-driven: from what plan decided (the job)
// and what the local API server holds, what it writes, deletes, and says.
func TestSync(t *testing.T) {
	a := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	headless := exporter("b", "web", "10.0.1.1", annotation.TypeHeadless)
	headlessA := exporter("a", "web", "10.0.0.1", annotation.TypeHeadless)
	wide := exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP)
	wide.Exports[0].Ports = append(wide.Exports[0].Ports, annotation.Port{Name: "metrics", Port: 9090, TargetPort: 9090, Protocol: "TCP"})
	for _, tc := range []struct {
		name     string
		objs     []runtime.Object
		job      func() job // nil: nothing wanted
		failSlab bool       // slice writes fail
		twice    bool       // the second of two syncs is checked
		// what is stored after the sync
		imported, derived bool
		slices            map[string]int // by source cluster
		wrote             bool
		err               string
		conflict          string // the ServiceExport's Conflict reason ("": none)
	}{{
		name:     "a ClusterSetIP service: its import with the derived Service's IPs, its slices",
		job:      func() job { return wantWeb(derivedApply, a) },
		imported: true, derived: true, slices: map[string]int{"a": 1}, wrote: true,
	}, {
		name:  "unchanged: nothing written again",
		job:   func() job { return wantWeb(derivedApply, a) },
		twice: true, imported: true, derived: true, slices: map[string]int{"a": 1},
	}, {
		name: "turned Headless: the derived Service and the slice of a cluster no longer exporting go",
		objs: ours(), job: func() job { return wantWeb(derivedNone, headless) },
		imported: true, slices: map[string]int{"b": 1}, wrote: true,
	}, {
		name: "turned Headless within DampMax: the derived Service is kept",
		objs: ours(), job: func() job { return wantWeb(derivedKeep, headlessA) },
		imported: true, derived: true, slices: map[string]int{"a": 1}, wrote: true,
	}, {
		name: "nothing wanted: every object of the service goes",
		objs: ours(), imported: false, wrote: true,
	}, {
		name: "a slice write fails: the error returned, nothing deleted",
		objs: ours(), job: func() job { return wantWeb(derivedApply, a) }, failSlab: true,
		imported: true, derived: true, slices: map[string]int{"z": 1}, wrote: true, err: "slice refused",
	}, {
		name: "exports that conflict: Conflict=True on the local ServiceExport",
		objs: []runtime.Object{webExport()}, job: func() job { return wantWeb(derivedApply, a, wide) },
		imported: true, derived: true, slices: map[string]int{"a": 1, "b": 1}, wrote: true, conflict: "PortConflict",
	}, {
		name: "one export: Conflict=False",
		objs: []runtime.Object{webExport()}, job: func() job { return wantWeb(derivedApply, a) },
		imported: true, derived: true, slices: map[string]int{"a": 1}, wrote: true, conflict: "NoConflicts",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())}, tc.objs...)
			if tc.failSlab {
				e.client.PrependReactor("patch", "endpointslices", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("slice refused")
				})
			}
			e.start(false)
			e.waitSynced()
			run := func() (bool, error) {
				j := job{k: webKey}
				if tc.job != nil {
					j = tc.job()
				}
				if j.out != nil {
					e.ctl.done[webKey] = j.out
				} else {
					delete(e.ctl.done, webKey)
				}
				return e.ctl.sync(e.ctx, j)
			}
			wrote, err := run()
			if tc.twice {
				e.poll("the informers to hold the writes", e.caughtUp)
				wrote, err = run()
			}
			if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
			if wrote != tc.wrote {
				t.Errorf("wrote %t, want %t", wrote, tc.wrote)
			}
			if got := e.serviceImport("web") != nil; got != tc.imported {
				t.Errorf("ServiceImport stored: %t, want %t", got, tc.imported)
			}
			if got := len(e.derivedServices()) == 1; got != tc.derived {
				t.Errorf("derived Service stored: %t, want %t", got, tc.derived)
			}
			got := map[string]int{}
			for _, s := range e.slices() {
				got[s.Labels[mcsv1beta1.LabelSourceCluster]]++
			}
			if len(got) != len(tc.slices) {
				t.Errorf("slices by cluster %v, want %v", got, tc.slices)
			}
			for cl, n := range tc.slices {
				if got[cl] != n {
					t.Errorf("slices by cluster %v, want %v", got, tc.slices)
				}
			}
			if tc.imported {
				// A ClusterSetIP import has its derived Service's IPs; a
				// Headless one none, even while its derived Service is kept.
				u := e.serviceImport("web")
				ips, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "ips")
				var want []string
				if typ, _, _ := unstructured.NestedString(u.Object, "spec", "type"); typ == "ClusterSetIP" && tc.derived {
					want = e.derivedServices()[0].Spec.ClusterIPs
				}
				if !slices.Equal(ips, want) {
					t.Errorf("import's IPs %v, want %v", ips, want)
				}
			}
			if tc.conflict != "" {
				u, err := e.dyn.Resource(exportsGVR).Namespace("ns").Get(e.ctx, "web", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if c := condition(u, "Conflict"); c == nil || c.Reason != tc.conflict {
					t.Errorf("Conflict condition %+v, want reason %s", c, tc.conflict)
				}
			}
		})
	}
}
