package mcscontroller

import (
	"cmp"
	"encoding/json"
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
// source cluster's export entry (annotation.Export as JSON): what the
// ServiceImport is merged from. After a restart, a cluster that cannot be
// reached yet is merged from its slices, so that its share stays as it was.
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

// kept is the share of a cluster whose records are not current (it has not
// answered since the controller started): its EndpointSlices as they are in
// the local API server, and the entry they were written from.
type kept struct {
	entry  annotation.Export
	slices []*discoveryv1.EndpointSlice
}

// keptShares reads the shares of the clusters in stale from the slices the
// controller wrote before. A slice without a readable entry is still kept
// (never deleted for a bad annotation), but cannot take part in a merge.
func keptShares(existing []*discoveryv1.EndpointSlice, stale func(cluster string) bool) map[clusterset.Key]map[string]*kept {
	out := map[clusterset.Key]map[string]*kept{}
	for _, s := range existing {
		cluster := s.Labels[mcsv1beta1.LabelSourceCluster]
		if !stale(cluster) {
			continue
		}
		k := clusterset.Key{Namespace: s.Namespace, Name: s.Labels[mcsv1beta1.LabelServiceName]}
		byCluster := out[k]
		if byCluster == nil {
			byCluster = map[string]*kept{}
			out[k] = byCluster
		}
		kc := byCluster[cluster]
		if kc == nil {
			kc = &kept{}
			byCluster[cluster] = kc
		}
		if kc.entry.Name == "" {
			var e annotation.Export
			if json.Unmarshal([]byte(s.Annotations[AnnotationExport]), &e) == nil && e.Name == k.Name {
				kc.entry = e
			}
		}
		kc.slices = append(kc.slices, s)
	}
	return out
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
