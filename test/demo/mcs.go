package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// mcsTimeout bounds how long the MCS controllers take to write what the
// annotators exported: the annotator writes the Pods, the controller's
// watches (local and through the peer link) see them, it writes.
const mcsTimeout = 30 * time.Second

var serviceImports = schema.GroupVersionResource{Group: harness.MCSGroup, Version: "v1beta1", Resource: "serviceimports"}

// mcsObjects are the MCS objects the controller keeps in one cluster: every
// ServiceImport and the EndpointSlices it manages, sorted by namespace and
// name.
type mcsObjects struct {
	imports []mcsv1beta1.ServiceImport
	slices  []discoveryv1.EndpointSlice
}

// readMCS reads them, as `kubectl get serviceimports,endpointslices -A -l
// endpointslice.kubernetes.io/managed-by=...` would.
func readMCS(r *harness.Program, c *harness.Cluster) (mcsObjects, error) {
	var o mcsObjects
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := c.Dynamic(r).Resource(serviceImports).List(cx, metav1.ListOptions{})
	if err != nil {
		return o, fmt.Errorf("%s: list ServiceImports: %w", c.Name, err)
	}
	for _, u := range list.Items {
		var si mcsv1beta1.ServiceImport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
			return o, fmt.Errorf("%s: ServiceImport %s/%s: %w", c.Name, u.GetNamespace(), u.GetName(), err)
		}
		o.imports = append(o.imports, si)
	}
	sl, err := c.Client.DiscoveryV1().EndpointSlices("").List(cx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + clusterset.ManagedBy})
	if err != nil {
		return o, fmt.Errorf("%s: list EndpointSlices: %w", c.Name, err)
	}
	o.slices = sl.Items
	slices.SortFunc(o.imports, func(a, b mcsv1beta1.ServiceImport) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(o.slices, func(a, b discoveryv1.EndpointSlice) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return o, nil
}

// String prints the objects as `kubectl get` would: what the demo compares
// before and after the cut (names, types, ClusterSetIPs, ports, clusters,
// endpoints and their conditions; no resource versions).
func (o mcsObjects) String() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tNAME\tTYPE\tCLUSTERSET-IP\tPORTS\tCLUSTERS")
	for _, si := range o.imports {
		var ports, clusters []string
		for _, p := range si.Spec.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d/%s", p.Name, p.Port, p.Protocol))
		}
		for _, c := range si.Status.Clusters {
			clusters = append(clusters, c.Cluster)
		}
		fmt.Fprintf(w, "%s\tserviceimport/%s\t%s\t%s\t%s\t%s\n", si.Namespace, si.Name, si.Spec.Type,
			orNone(strings.Join(si.Spec.IPs, ",")), orNone(strings.Join(ports, ",")), orNone(strings.Join(clusters, ",")))
	}
	w.Flush()
	b.WriteString("\n")
	w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tNAME\tSOURCE-CLUSTER\tSERVICE\tPORTS\tENDPOINTS (READY)")
	for _, s := range o.slices {
		var ports, eps []string
		for _, p := range s.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d", deref(p.Name), deref(p.Port)))
		}
		for _, e := range s.Endpoints {
			eps = append(eps, fmt.Sprintf("%s (%v)", strings.Join(e.Addresses, ","), deref(e.Conditions.Ready)))
		}
		fmt.Fprintf(w, "%s\tendpointslice/%s\t%s\t%s\t%s\t%s\n", s.Namespace, s.Name, s.Labels[mcsv1beta1.LabelSourceCluster],
			orNone(s.Labels[discoveryv1.LabelServiceName]), orNone(strings.Join(ports, ",")), strings.Join(eps, " "))
	}
	w.Flush()
	return strings.TrimRight(b.String(), "\n")
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// check compares the objects with what the annotators exported in the
// watched clusters: a ServiceImport per exported service (of the type its
// Service has: ClusterSetIP with an IP, or Headless without), naming the
// exporting clusters, and per exporting cluster EndpointSlices holding the
// addresses of its exported Pods. Nothing else.
func (o mcsObjects) check(world model, types map[string]mcsv1beta1.ServiceImportType, watched []string) error {
	want := map[string]map[string][]string{} // "ns/name" -> cluster -> addresses
	for svc, eps := range world {
		name, ns, _ := strings.Cut(svc, ".")
		for _, e := range eps {
			if !slices.Contains(watched, e.cluster) {
				continue
			}
			k := ns + "/" + name
			if want[k] == nil {
				want[k] = map[string][]string{}
			}
			want[k][e.cluster] = append(want[k][e.cluster], e.ip)
		}
	}
	got := map[string]map[string][]string{}
	for _, s := range o.slices {
		k := s.Namespace + "/" + s.Labels[mcsv1beta1.LabelServiceName]
		if got[k] == nil {
			got[k] = map[string][]string{}
		}
		cl := s.Labels[mcsv1beta1.LabelSourceCluster]
		for _, e := range s.Endpoints {
			got[k][cl] = append(got[k][cl], e.Addresses...)
		}
	}
	imports := map[string]mcsv1beta1.ServiceImport{}
	for _, si := range o.imports {
		k := si.Namespace + "/" + si.Name
		if want[k] == nil {
			return fmt.Errorf("ServiceImport %s: no watched cluster exports it", k)
		}
		imports[k] = si
	}
	for k, byCluster := range want {
		si, ok := imports[k]
		if !ok {
			return fmt.Errorf("no ServiceImport %s", k)
		}
		name, _ := strings.CutPrefix(k, si.Namespace+"/")
		typ := types[name+"."+si.Namespace]
		switch {
		case si.Spec.Type != typ:
			return fmt.Errorf("ServiceImport %s: type %s, want %s", k, si.Spec.Type, typ)
		case typ == mcsv1beta1.ClusterSetIP && len(si.Spec.IPs) == 0:
			return fmt.Errorf("ServiceImport %s: no ClusterSetIP yet", k)
		case typ == mcsv1beta1.Headless && len(si.Spec.IPs) > 0:
			return fmt.Errorf("ServiceImport %s: Headless with IPs %v", k, si.Spec.IPs)
		}
		var clusters, wantClusters []string
		for _, c := range si.Status.Clusters {
			clusters = append(clusters, c.Cluster)
		}
		for c, addrs := range byCluster {
			wantClusters = append(wantClusters, c)
			have := slices.Clone(got[k][c])
			slices.Sort(have)
			slices.Sort(addrs)
			if !slices.Equal(have, addrs) {
				return fmt.Errorf("EndpointSlices of %s from %s: addresses %v, want %v", k, c, have, addrs)
			}
		}
		slices.Sort(clusters)
		slices.Sort(wantClusters)
		if !slices.Equal(clusters, wantClusters) {
			return fmt.Errorf("ServiceImport %s: status.clusters %v, want %v", k, clusters, wantClusters)
		}
		if len(got[k]) != len(byCluster) {
			return fmt.Errorf("EndpointSlices of %s from clusters %v, want %v", k, got[k], wantClusters)
		}
	}
	for k := range got {
		if want[k] == nil {
			return fmt.Errorf("EndpointSlices of %s: no watched cluster exports it", k)
		}
	}
	return nil
}

// clusterSetIPChecks are the queries of the ClusterSetIP services, each
// answered with the IP of its ServiceImport in the cluster of the CoreDNS
// asked.
func (o mcsObjects) clusterSetIPChecks() []check {
	var out []check
	for _, si := range o.imports {
		if si.Spec.Type != mcsv1beta1.ClusterSetIP {
			continue
		}
		want := slices.Clone(si.Spec.IPs)
		slices.Sort(want)
		out = append(out, check{name: si.Name + "." + si.Namespace + ".svc." + zone, qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			want: want, note: "the ClusterSetIP of ServiceImport " + si.Namespace + "/" + si.Name + " (the derived Service's ClusterIP)"})
	}
	return out
}

// waitMCS waits until the objects of every site are right, and returns them.
func waitMCS(r *harness.Program, sites []*site, world model, types map[string]mcsv1beta1.ServiceImportType) map[string]mcsObjects {
	out := map[string]mcsObjects{}
	took := harness.Eventually(r, mcsTimeout, func() error {
		for _, s := range sites {
			o, err := readMCS(r, s.c)
			if err == nil {
				err = o.check(world, types, s.watched)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.c.Name, err)
			}
			out[s.c.Name] = o
		}
		return nil
	})
	fmt.Printf("   the MCS controllers wrote every object in %s\n", took.Round(time.Millisecond))
	return out
}

// showMCS prints one cluster's objects.
func showMCS(name string, o mcsObjects) {
	fmt.Printf("   %s: kubectl get serviceimports -A; kubectl get endpointslices -A -l endpointslice.kubernetes.io/managed-by=%s\n", name, clusterset.ManagedBy)
	fmt.Println(harness.Indent(o.String(), "   | "))
}

// sameMCS fails unless the objects of every site whose API server answers
// are as they were.
func sameMCS(r *harness.Program, sites []*site, before map[string]mcsObjects, when string) {
	for _, s := range sites {
		if s.c.Ready() != nil {
			continue
		}
		o, err := readMCS(r, s.c)
		if err != nil {
			r.Fatalf("%s: %v", when, err)
		}
		if o.String() != before[s.c.Name].String() {
			r.Fatalf("%s: the MCS objects of %s changed:\n%s\nwere:\n%s", when, s.c.Name, o, before[s.c.Name])
		}
	}
}
