package soak

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The MCS controller's objects in edge-a are read every mcsCheckEvery, each
// list bounded by mcsReadTimeout.
const (
	mcsCheckEvery  = 500 * time.Millisecond
	mcsReadTimeout = 2 * time.Second
)

var serviceImports = schema.GroupVersionResource{Group: harness.MCSGroup, Version: "v1beta1", Resource: "serviceimports"}

// mcsObjects is what the controller keeps in a namespace, as read at one
// check: the ServiceImports by name, the Services (derived ones are found
// by their owner), and the controller's EndpointSlices by service.
type mcsObjects struct {
	imports  map[string]*mcsv1beta1.ServiceImport
	services []corev1.Service
	slices   map[string][]discoveryv1.EndpointSlice
}

// mcsReader reads the controller's objects through clients of their own
// whose every request is bounded by mcsReadTimeout.
type mcsReader struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	ns     string
}

func newMCSReader(cfg *rest.Config, ns string) (*mcsReader, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = mcsReadTimeout
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &mcsReader{client: client, dyn: dyn, ns: ns}, nil
}

// read lists the objects; at is when the EndpointSlices' list began (what
// they hold is at least that recent).
func (r *mcsReader) read(ctx context.Context) (o mcsObjects, at time.Time, err error) {
	cx, cancel := context.WithTimeout(ctx, 3*mcsReadTimeout)
	defer cancel()
	o = mcsObjects{imports: map[string]*mcsv1beta1.ServiceImport{}, slices: map[string][]discoveryv1.EndpointSlice{}}
	list, err := r.dyn.Resource(serviceImports).Namespace(r.ns).List(cx, metav1.ListOptions{})
	if err != nil {
		return o, at, fmt.Errorf("ServiceImports: %w", err)
	}
	for _, u := range list.Items {
		var si mcsv1beta1.ServiceImport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
			return o, at, fmt.Errorf("ServiceImport %s: %w", u.GetName(), err)
		}
		o.imports[si.Name] = &si
	}
	svcs, err := r.client.CoreV1().Services(r.ns).List(cx, metav1.ListOptions{})
	if err != nil {
		return o, at, fmt.Errorf("Services: %w", err)
	}
	o.services = svcs.Items
	at = time.Now()
	eps, err := r.client.DiscoveryV1().EndpointSlices(r.ns).List(cx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + clusterset.ManagedBy})
	if err != nil {
		return o, at, fmt.Errorf("EndpointSlices: %w", err)
	}
	for _, s := range eps.Items {
		svc := s.Labels[mcsv1beta1.LabelServiceName]
		o.slices[svc] = append(o.slices[svc], s)
	}
	return o, at, nil
}

// importIPs waits (a minute at most) until svc's ServiceImport has its
// ClusterSetIPs, and returns them.
func (r *mcsReader) importIPs(t harness.T, svc string) []string {
	t.Helper()
	var ips []string
	harness.Eventually(t, time.Minute, func() error {
		o, _, err := r.read(context.Background())
		if err != nil {
			return err
		}
		if si := o.imports[svc]; si == nil || len(si.Spec.IPs) == 0 {
			return fmt.Errorf("%s: no ServiceImport with a ClusterSetIP yet", svc)
		}
		ips = o.imports[svc].Spec.IPs
		return nil
	})
	return ips
}

// mcsVerdict classifies svc's objects: its ServiceImport (type, the port
// every cluster exports, status.clusters, the ClusterSetIPs vips when the
// service is exported as ClusterSetIP, none else), the derived Service it
// owns (ClusterIPs equal to the import's) and the ready addresses of its
// EndpointSlices by source cluster (through classify: a set each cluster's
// part has had, stale from when it stopped being current). Faults are read
// in the mcs/ scopes. m.mu is not held.
func (m *model) mcsVerdict(svc string, vips []string, o mcsObjects, now time.Time) classified {
	m.mu.Lock()
	defer m.mu.Unlock()
	both := []string{"edge-a", "edge-b"}
	wrong := func(format string, args ...any) classified {
		return classified{v: "wrong", after: -1, why: fmt.Sprintf(format, args...)}
	}
	si := o.imports[svc]
	if si == nil {
		return m.missing(svc, both, "mcs/", now, "no ServiceImport")
	}
	want := mcsv1beta1.Headless
	if isClusterSetIP(svc) {
		want = mcsv1beta1.ClusterSetIP
	}
	if si.Spec.Type != want {
		return wrong("ServiceImport type %s, want %s", si.Spec.Type, want)
	}
	if p := si.Spec.Ports; len(p) != 1 || p[0].Name != "http" || p[0].Port != 80 || p[0].Protocol != corev1.ProtocolTCP {
		return wrong("ServiceImport ports %v, want http 80/TCP", p)
	}
	var clusters []string
	for _, c := range si.Status.Clusters {
		clusters = append(clusters, c.Cluster)
	}
	slices.Sort(clusters)
	for i, cl := range clusters {
		if !slices.Contains(both, cl) || (i > 0 && clusters[i-1] == cl) {
			return wrong("ServiceImport clusters %v", clusters)
		}
	}
	var derived []corev1.Service
	for _, s := range o.services {
		for _, ref := range s.OwnerReferences {
			if ref.UID == si.UID {
				derived = append(derived, s)
			}
		}
	}
	if want == mcsv1beta1.ClusterSetIP {
		switch {
		case len(si.Spec.IPs) == 0:
			return m.missing(svc, both, "mcs/", now, "no ClusterSetIP")
		case !slices.Equal(si.Spec.IPs, vips):
			return wrong("ClusterSetIP %v, was %v while exported", si.Spec.IPs, vips)
		case len(derived) == 0:
			return m.missing(svc, both, "mcs/", now, "no derived Service")
		case len(derived) > 1:
			return wrong("%d derived Services", len(derived))
		case !slices.Equal(derived[0].Spec.ClusterIPs, si.Spec.IPs):
			return wrong("derived Service %s has ClusterIPs %v, the import %v", derived[0].Name, derived[0].Spec.ClusterIPs, si.Spec.IPs)
		}
	} else if len(si.Spec.IPs) > 0 || len(derived) > 0 {
		return wrong("a Headless import with IPs %v and %d derived Services", si.Spec.IPs, len(derived))
	}
	by := map[string][]string{}
	for _, s := range o.slices[svc] {
		cl := s.Labels[mcsv1beta1.LabelSourceCluster]
		if !slices.Contains(both, cl) {
			return wrong("EndpointSlice %s from cluster %q", s.Name, cl)
		}
		if name, ok := s.Labels[discoveryv1.LabelServiceName]; (want == mcsv1beta1.ClusterSetIP) != ok || (ok && name != derived[0].Name) {
			return wrong("EndpointSlice %s names Service %q", s.Name, name)
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				by[cl] = append(by[cl], e.Addresses...)
			}
		}
	}
	for _, ips := range by {
		slices.Sort(ips)
	}
	r := m.classify(svc, by, "mcs/", true, now)
	if r.v == "ok" || r.v == "stale" {
		var absent []string
		for _, cl := range both {
			if !slices.Contains(clusters, cl) {
				absent = append(absent, cl)
			}
		}
		if len(absent) > 0 {
			return m.missing(svc, absent, "mcs/", now, fmt.Sprintf("%s not in the ServiceImport's clusters", strings.Join(absent, " and ")))
		}
	}
	return r
}

// mcsCounts are the MCS objects' figures of a run.
type mcsCounts struct {
	checked, ok, stale, wrong, missing, missingLate, reads, readErrors atomic.Int64
	longest, longestAfter, longestMissing                              atomic.Int64
	mu                                                                 sync.Mutex
	examples, missingExamples                                          []string
	longestAfterWhat, longestMissingWhat                               string
}

// check reads the objects once and classifies every service's; a read that
// fails (edge-a's API server is restarting, or slow) is counted and checks
// nothing.
func (c *mcsCounts) check(ctx context.Context, r *mcsReader, m *model, names []string, vips map[string][]string, start time.Time) {
	c.reads.Add(1)
	o, at, err := r.read(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.readErrors.Add(1)
		}
		return
	}
	note := func(list *[]string, svc string, v classified) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(*list) < 10 {
			*list = append(*list, fmt.Sprintf("%s at %s: %s", svc, at.Sub(start).Round(time.Millisecond), v.why))
		}
	}
	for _, svc := range names {
		v := m.mcsVerdict(svc, vips[svc], o, at)
		c.checked.Add(1)
		switch v.v {
		case "ok":
			c.ok.Add(1)
		case "stale":
			c.stale.Add(1)
			maxInto(&c.longest, v.stale.Milliseconds())
			longestWith(&c.mu, &c.longestAfter, &c.longestAfterWhat, v.after, fmt.Sprintf("%s at %s", v.afterWhat, at.Sub(start).Round(time.Millisecond)))
		case "missing":
			c.missing.Add(1)
			note(&c.missingExamples, svc, v)
			if v.after > maxStalenessAfterRecovery {
				c.missingLate.Add(1)
			}
			longestWith(&c.mu, &c.longestMissing, &c.longestMissingWhat, v.after, fmt.Sprintf("%s at %s", v.afterWhat, at.Sub(start).Round(time.Millisecond)))
		default:
			c.wrong.Add(1)
			note(&c.examples, svc, v)
		}
	}
}
