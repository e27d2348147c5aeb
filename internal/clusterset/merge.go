// Package clusterset merges what the clusters of a clusterset export into
// what one cluster imports, as KEP-1645 (Multi-Cluster Services) defines it:
// the ServiceImport of each exported service, the clusters behind it, the
// conflicts each ServiceExport is told about, and the EndpointSlices that
// carry each cluster's endpoints. It makes no API calls: the MCS controller
// feeds it what it read and writes what it returns.
package clusterset

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Key names an exported service: the ServiceImport of the same namespace and
// name stands for it in every cluster.
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Export is one cluster's export of a service, as that cluster states it.
type Export struct {
	Cluster string
	// Created is when the export began (the ServiceExport's creation time,
	// or the Service's when exported by annotation): the oldest export wins
	// a conflict, and the cluster ID breaks a tie.
	Created time.Time

	Type                  mcsv1beta1.ServiceImportType
	Ports                 []mcsv1beta1.ServicePort
	SessionAffinity       corev1.ServiceAffinity
	SessionAffinityConfig *corev1.SessionAffinityConfig
	InternalTrafficPolicy *corev1.ServiceInternalTrafficPolicy
	TrafficDistribution   *string

	// Labels and Annotations are the ServiceExport's exportedLabels and
	// exportedAnnotations: what the ServiceImport carries.
	Labels, Annotations map[string]string
}

// Import is the merged view of one service: what its ServiceImport says, and
// what its ServiceExports are told.
type Import struct {
	// Spec is the ServiceImport's spec without its IPs (the controller
	// allocates those through the derived Service).
	Spec                mcsv1beta1.ServiceImportSpec
	Labels, Annotations map[string]string
	// Clusters are the exporting clusters, sorted.
	Clusters []string
	// Oldest is the cluster whose export won every conflict.
	Oldest string
	// Conflicts are the reasons of the Conflict condition, in the order of
	// the mcs-api constants; empty: no conflict. KEP-1645 reports a conflict
	// on every constituent ServiceExport, the oldest's included.
	Conflicts []mcsv1beta1.ServiceExportConditionReason
	// Message says, for each conflict, which clusters differ from the oldest.
	Message string
}

// Conflict reports whether the exports disagree on anything.
func (im *Import) Conflict() bool { return len(im.Conflicts) > 0 }

// Reason is the Conflict condition's reason: the conflicts joined by commas
// (as mcs-api allows), or NoConflicts.
func (im *Import) Reason() string {
	if !im.Conflict() {
		return string(mcsv1beta1.ServiceExportReasonNoConflicts)
	}
	rs := make([]string, len(im.Conflicts))
	for i, r := range im.Conflicts {
		rs[i] = string(r)
	}
	return strings.Join(rs, ",")
}

// conflictOrder is the order reasons are reported in.
var conflictOrder = []mcsv1beta1.ServiceExportConditionReason{
	mcsv1beta1.ServiceExportReasonTypeConflict,
	mcsv1beta1.ServiceExportReasonPortConflict,
	mcsv1beta1.ServiceExportReasonSessionAffinityConflict,
	mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict,
	mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict,
	mcsv1beta1.ServiceExportReasonTrafficDistributionConflict,
	mcsv1beta1.ServiceExportReasonLabelsConflict,
	mcsv1beta1.ServiceExportReasonAnnotationsConflict,
}

// Merge merges the exports of one service (at least one; one per cluster)
// by KEP-1645's rules. The oldest export decides the type, session affinity,
// traffic policies, labels and annotations; the ports are the union of every
// export's ports by name, and where two exports give one name different
// ports (port, protocol or appProtocol), or two names the same port and
// protocol, the older one's is kept. Every disagreement is a conflict.
func Merge(exports []Export) Import {
	ex := slices.Clone(exports)
	slices.SortFunc(ex, func(a, b Export) int {
		return annotation.CompareAge(a.Created, a.Cluster, b.Created, b.Cluster)
	})
	w := ex[0]
	im := Import{
		Spec: mcsv1beta1.ServiceImportSpec{
			Type:                  w.Type,
			SessionAffinity:       w.SessionAffinity,
			SessionAffinityConfig: w.SessionAffinityConfig.DeepCopy(),
			InternalTrafficPolicy: w.InternalTrafficPolicy,
			TrafficDistribution:   w.TrafficDistribution,
		},
		Labels:      maps.Clone(w.Labels),
		Annotations: maps.Clone(w.Annotations),
		Oldest:      w.Cluster,
	}
	if im.Spec.SessionAffinity == "" {
		im.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	// Said as a Service says it once the API server has defaulted it: an
	// entry leaves out the default.
	if im.Spec.InternalTrafficPolicy == nil {
		im.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	}
	differ := map[mcsv1beta1.ServiceExportConditionReason][]string{}
	note := func(r mcsv1beta1.ServiceExportConditionReason, cluster string) {
		if !slices.Contains(differ[r], cluster) {
			differ[r] = append(differ[r], cluster)
		}
	}

	byName := map[string]mcsv1beta1.ServicePort{}
	type portProto struct {
		port  int32
		proto corev1.Protocol
	}
	byPort := map[portProto]string{}
	for _, e := range ex {
		im.Clusters = append(im.Clusters, e.Cluster)
		if e.Type != w.Type {
			note(mcsv1beta1.ServiceExportReasonTypeConflict, e.Cluster)
		}
		if affinity(e.SessionAffinity) != im.Spec.SessionAffinity {
			note(mcsv1beta1.ServiceExportReasonSessionAffinityConflict, e.Cluster)
		}
		if !equality.Semantic.DeepEqual(e.SessionAffinityConfig, w.SessionAffinityConfig) {
			note(mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict, e.Cluster)
		}
		if trafficPolicy(e.InternalTrafficPolicy) != trafficPolicy(w.InternalTrafficPolicy) {
			note(mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict, e.Cluster)
		}
		if deref(e.TrafficDistribution) != deref(w.TrafficDistribution) {
			note(mcsv1beta1.ServiceExportReasonTrafficDistributionConflict, e.Cluster)
		}
		if !maps.Equal(e.Labels, w.Labels) {
			note(mcsv1beta1.ServiceExportReasonLabelsConflict, e.Cluster)
		}
		if !maps.Equal(e.Annotations, w.Annotations) {
			note(mcsv1beta1.ServiceExportReasonAnnotationsConflict, e.Cluster)
		}
		for _, p := range e.Ports {
			p.Protocol = protocol(p.Protocol)
			if have, ok := byName[p.Name]; ok {
				if have.Port != p.Port || have.Protocol != p.Protocol || deref(have.AppProtocol) != deref(p.AppProtocol) {
					note(mcsv1beta1.ServiceExportReasonPortConflict, e.Cluster)
				}
				continue
			}
			pp := portProto{p.Port, p.Protocol}
			if _, taken := byPort[pp]; taken {
				note(mcsv1beta1.ServiceExportReasonPortConflict, e.Cluster)
				continue
			}
			byName[p.Name], byPort[pp] = p, p.Name
			im.Spec.Ports = append(im.Spec.Ports, p)
		}
	}
	slices.Sort(im.Clusters)
	slices.SortFunc(im.Spec.Ports, func(a, b mcsv1beta1.ServicePort) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	// Ports not identical in every export are a conflict too (KEP-1645,
	// "Service Port"; mcs-api's PortConflict): the import has the union,
	// and each export is told which of its ports the others add.
	missing := missingPorts(ex, im.Spec.Ports)

	var msg []string
	for _, r := range conflictOrder {
		cs, ok := differ[r]
		if r == mcsv1beta1.ServiceExportReasonPortConflict && len(missing) > 0 {
			im.Conflicts = append(im.Conflicts, r)
			m := fmt.Sprintf("%s: the exports' ports differ and the ServiceImport has their union: %s", r, missingMessage(missing))
			if ok {
				m += fmt.Sprintf("; %s give a port name another port, protocol or appProtocol than the oldest export (cluster %s), whose value is used",
					ClusterList(cs), im.Oldest)
			}
			msg = append(msg, m)
			continue
		}
		if !ok {
			continue
		}
		im.Conflicts = append(im.Conflicts, r)
		msg = append(msg, fmt.Sprintf("%s: %s differ from the oldest export (cluster %s), whose value is used",
			r, ClusterList(cs), im.Oldest))
	}
	if len(msg) == 0 {
		im.Message = fmt.Sprintf("exported by %s without conflicts", ClusterList(im.Clusters))
	} else {
		im.Message = strings.Join(msg, "; ")
	}
	return im
}

// lacking is a cluster whose export lacks ports of the union (by name).
type lacking struct {
	cluster string
	ports   []mcsv1beta1.ServicePort
}

// missingPorts lists, by cluster, the ports of union whose names an export
// does not have (nil: every export has every name).
func missingPorts(ex []Export, union []mcsv1beta1.ServicePort) []lacking {
	var out []lacking
	for _, e := range ex {
		var l lacking
		for _, u := range union {
			if !slices.ContainsFunc(e.Ports, func(p mcsv1beta1.ServicePort) bool { return p.Name == u.Name }) {
				l.ports = append(l.ports, u)
			}
		}
		if len(l.ports) > 0 {
			l.cluster = e.Cluster
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b lacking) int { return cmp.Compare(a.cluster, b.cluster) })
	return out
}

// maxNamed bounds the clusters, and the ports of each, that a message
// names; the others are counted.
const maxNamed = 5

// missingMessage says which ports each cluster does not export: "cluster
// a does not export grpc 9000/TCP, metrics 9090/TCP; cluster b does not
// export grpc 9000/TCP".
func missingMessage(ls []lacking) string {
	var parts []string
	for i, l := range ls {
		if i == maxNamed {
			parts = append(parts, fmt.Sprintf("and %d more clusters", len(ls)-maxNamed))
			break
		}
		var ps []string
		for j, p := range l.ports {
			if j == maxNamed {
				ps = append(ps, fmt.Sprintf("and %d more", len(l.ports)-maxNamed))
				break
			}
			ps = append(ps, strings.TrimSpace(fmt.Sprintf("%s %d/%s", p.Name, p.Port, p.Protocol)))
		}
		parts = append(parts, fmt.Sprintf("cluster %s does not export %s", l.cluster, strings.Join(ps, ", ")))
	}
	return strings.Join(parts, "; ")
}

// ClusterList names clusters for a message: "cluster a" or "clusters a, b" (sorted).
func ClusterList(cs []string) string {
	s := slices.Clone(cs)
	slices.Sort(s)
	if len(s) == 1 {
		return "cluster " + s[0]
	}
	return "clusters " + strings.Join(s, ", ")
}

// affinity, trafficPolicy and protocol apply the API's defaults, so that an
// unset field and its default do not conflict.
func affinity(a corev1.ServiceAffinity) corev1.ServiceAffinity {
	if a == "" {
		return corev1.ServiceAffinityNone
	}
	return a
}

func trafficPolicy(p *corev1.ServiceInternalTrafficPolicy) corev1.ServiceInternalTrafficPolicy {
	if p == nil {
		return corev1.ServiceInternalTrafficPolicyCluster
	}
	return *p
}

func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
