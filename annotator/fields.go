package annotator

import (
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// serviceFields is what an export entry says of svc for the MCS controllers
// of the clusterset (annotation.Service): its type, affinity and traffic
// policies, a Headless Service's IP families, when the export began (the ServiceExport's creation, else the
// Service's), and the ServiceExport's exported labels and annotations. se is
// nil for a Service exported by annotation.
func serviceFields(svc *corev1.Service, se *unstructured.Unstructured) annotation.Service {
	f := annotation.Service{
		Type:                annotation.TypeClusterSetIP,
		SessionAffinity:     string(svc.Spec.SessionAffinity),
		TrafficDistribution: ptrString(svc.Spec.TrafficDistribution),
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		f.Type = annotation.TypeHeadless
		// Only a Headless import takes its families from the entries: a
		// ClusterSetIP one has its derived Service's, so the entries of
		// ClusterSetIP Services stay as they were (no rewrite of every
		// exported Pod when the annotator is upgraded).
		var fams []string
		for _, fam := range svc.Spec.IPFamilies {
			fams = append(fams, string(fam))
		}
		f.IPFamilies = annotation.NewIPFamilies(fams...)
	}
	if f.SessionAffinity == string(corev1.ServiceAffinityNone) {
		f.SessionAffinity = "" // the default, left out
	}
	if c := svc.Spec.SessionAffinityConfig; f.SessionAffinity != "" && c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		f.SessionAffinityTimeoutSeconds = *c.ClientIP.TimeoutSeconds
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p != corev1.ServiceInternalTrafficPolicyCluster {
		f.InternalTrafficPolicy = string(*p)
	}
	created := svc.CreationTimestamp.Time
	if se != nil {
		created = se.GetCreationTimestamp().Time
		f.Labels = exportedMap(se, "exportedLabels")
		f.Annotations = exportedMap(se, "exportedAnnotations")
	}
	if !created.IsZero() {
		f.ExportedAt = created.UTC().Format(time.RFC3339)
	}
	return f
}

// exportedMap reads spec.<field> of a ServiceExport as a map of strings; nil
// when absent or of another shape (the CRD's schema makes it a map).
func exportedMap(se *unstructured.Unstructured, field string) map[string]string {
	m, ok, err := unstructured.NestedStringMap(se.Object, "spec", field)
	if !ok || err != nil || len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
