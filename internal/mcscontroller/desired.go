package mcscontroller

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// AnnotationExport on each EndpointSlice the controller writes holds the
// source cluster's export entry (annotation.Export as JSON), for people and
// tools to read: the controller never reads it back (a cluster's share comes
// from its records only, after a restart from the snapshot, see
// RestoreSnapshot).
const AnnotationExport = "multicluster.mcsannotations.io/export"

// share is one cluster's part of one service: its export entry and its
// endpoints.
type share struct {
	entry     annotation.Export
	endpoints []clusterset.Endpoint
	recs      []*store.Pod // behind endpoints (a relay hub relays them)
}

// shares groups the records of the clusters whose records are current by
// service and cluster. Every Pod of a service in a cluster carries the same
// entry, as the annotator writes it; while they differ (a Service changed and
// the annotator is rewriting its Pods) the entry of the Pod that sorts first
// by name is used, so the choice is stable.
func shares(pods []*store.Pod) map[clusterset.Key]map[string]*share {
	slices.SortFunc(pods, func(a, b *store.Pod) int {
		return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	out := map[clusterset.Key]map[string]*share{}
	for _, p := range pods {
		for _, e := range p.Exports {
			k := clusterset.Key{Namespace: e.Namespace, Name: e.Name}
			byCluster := out[k]
			if byCluster == nil {
				byCluster = map[string]*share{}
				out[k] = byCluster
			}
			s := byCluster[p.Cluster]
			if s == nil {
				s = &share{entry: e}
				byCluster[p.Cluster] = s
			}
			if len(p.IPs) == 0 {
				continue
			}
			ep := clusterset.Endpoint{Addresses: p.IPs, Hostname: p.EndpointHostname(), Ready: p.Ready, Serving: p.Ready}
			for _, port := range e.Ports {
				ep.Ports = append(ep.Ports, clusterset.EndpointPort{
					Name: port.Name, Protocol: corev1.Protocol(port.Protocol), Port: port.TargetPort, AppProtocol: optional(port.AppProtocol),
				})
			}
			s.endpoints = append(s.endpoints, ep)
			s.recs = append(s.recs, p)
		}
	}
	return out
}

// toExport is an export entry as clusterset.Merge reads it.
func toExport(cluster string, e *annotation.Export) clusterset.Export {
	x := clusterset.Export{
		Cluster:               cluster,
		Created:               e.Exported(),
		Type:                  mcsv1beta1.Headless,
		SessionAffinity:       corev1.ServiceAffinity(e.SessionAffinity),
		InternalTrafficPolicy: (*corev1.ServiceInternalTrafficPolicy)(optional(e.InternalTrafficPolicy)),
		TrafficDistribution:   optional(e.TrafficDistribution),
		Labels:                e.Labels,
		Annotations:           e.Annotations,
	}
	if e.ServiceType() == annotation.TypeClusterSetIP {
		x.Type = mcsv1beta1.ClusterSetIP
	}
	if t := e.SessionAffinityTimeoutSeconds; t > 0 {
		x.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(t)}}
	}
	for _, p := range e.Ports {
		x.Ports = append(x.Ports, mcsv1beta1.ServicePort{
			Name: p.Name, Protocol: corev1.Protocol(p.Protocol), Port: p.Port, AppProtocol: optional(p.AppProtocol),
		})
	}
	return x
}

// exportedFamilies is the union of the entries' ipFamilies, IPv4 first: a
// Headless import's spec.ipFamilies; none when no entry says them.
func exportedFamilies(families []string) []corev1.IPFamily {
	var out []corev1.IPFamily
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		if slices.Contains(families, string(f)) {
			out = append(out, f)
		}
	}
	return out
}

// heldSlices are the EndpointSlices of the clusters in stale (not heard from
// since the controller started, and not restored from its snapshot), by
// service and cluster: their share is not known, so their slices are left as
// the local API server holds them, neither rebuilt nor deleted, until the
// cluster is heard from or its expiry passes, while the other clusters'
// shares of the same service are planned as usual. No record is read out
// of them (whoever may write EndpointSlices could have written it), only
// their port names (heldPorts).
func heldSlices(existing []*discoveryv1.EndpointSlice, stale func(cluster string) bool) map[clusterset.Key]map[string][]*discoveryv1.EndpointSlice {
	out := map[clusterset.Key]map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range existing {
		cluster := s.Labels[mcsv1beta1.LabelSourceCluster]
		if !stale(cluster) {
			continue
		}
		k := clusterset.Key{Namespace: s.Namespace, Name: s.Labels[mcsv1beta1.LabelServiceName]}
		if out[k] == nil {
			out[k] = map[string][]*discoveryv1.EndpointSlice{}
		}
		out[k][cluster] = append(out[k][cluster], s)
	}
	return out
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
