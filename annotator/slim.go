package annotator

import (
	"bytes"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// FieldManager is the server-side apply field manager the annotator writes
// Pods with. What it owns is what it removes when nothing exports a Pod.
const FieldManager = "mcs-annotator"

// The fields the annotator owns on a Pod, as they appear in managedFields.
var (
	fieldExport            = []byte(`"f:` + annotation.ExportAnnotation + `"`)
	fieldSignature         = []byte(`"f:` + annotation.SignatureAnnotation + `"`)
	fieldLabel             = []byte(`"f:` + annotation.ExporterLabel + `"`)
	fieldImporter          = []byte(`"f:` + annotation.ImporterLabel + `"`)
	fieldEndpoint          = []byte(`"f:` + annotation.EndpointAnnotation + `"`)
	fieldEndpointSignature = []byte(`"f:` + annotation.EndpointSignatureAnnotation + `"`)
)

// ownAnnotations are the annotations the annotator writes on a Pod, which
// the Pod informer keeps.
var ownAnnotations = []string{annotation.ExportAnnotation, annotation.SignatureAnnotation,
	annotation.EndpointAnnotation, annotation.EndpointSignatureAnnotation}

// slimPod is the transform of the Pod informer: it keeps what selecting,
// resolving ports and comparing needs (name, namespace, UID, labels, the
// annotations the annotator writes, whether the Pod imports anything, the
// annotator's own managedFields entries, container ports, phase, deletion)
// and drops the rest of the Pod before it is stored.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // tombstones pass through
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp,
			Labels: pod.Labels,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	for _, k := range ownAnnotations {
		if v, ok := pod.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	if strings.TrimSpace(pod.Annotations[annotation.ImportAnnotation]) != "" {
		// Only whether the Pod imports anything matters here (it gets the
		// importer label); the value, up to the API server's 256 KiB of
		// annotations, is not kept. The stand-in is not blank, so that a
		// second pass of the transform over its own output (client-go's
		// informers may make one) keeps it.
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[annotation.ImportAnnotation] = importsStandIn
	}
	for _, mf := range pod.ManagedFields {
		if mf.Manager == FieldManager {
			out.ManagedFields = append(out.ManagedFields, mf)
		}
	}
	out.Spec.Containers = slimContainers(pod.Spec.Containers, false)
	out.Spec.InitContainers = slimContainers(pod.Spec.InitContainers, true)
	return out, nil
}

// slimPodEndpoint is slimPod that also keeps what an endpoint statement
// says (--sign-endpoints): the addresses, spec.hostname and the Ready
// condition's status, so that a change of any of them is an update the
// handler sees (slimPod drops them, so that a Pod's status updates, which
// are frequent, queue nothing when no statement is written).
func slimPodEndpoint(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	o, _ := slimPod(pod)
	out := o.(*corev1.Pod)
	out.Spec.Hostname = pod.Spec.Hostname
	out.Status.PodIP, out.Status.PodIPs = pod.Status.PodIP, pod.Status.PodIPs
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			break
		}
	}
	return out, nil
}

// slimPodRecord is slimPod that also keeps, on a Pod with the exporter
// label, what slimPodEndpoint keeps (Config.RecordFields): the MCS
// controller's local source makes its record from it. Other Pods, which
// the source does not read, keep no more than slimPod.
func slimPodRecord(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok && pod.Labels[annotation.ExporterLabel] == annotation.LabelValue {
		return slimPodEndpoint(pod)
	}
	return slimPod(obj)
}

// reslim is slimPod of a Pod that a wider transform kept (other objects
// pass through), for comparing what the annotator reads.
func reslim(obj any) any {
	o, _ := slimPod(obj)
	return o
}

// slimContainers keeps the ports (and, for init containers, only sidecars,
// which keep running and can serve).
func slimContainers(cs []corev1.Container, sidecarsOnly bool) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		if len(c.Ports) == 0 {
			continue
		}
		if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
			continue
		}
		out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
	}
	return out
}

// exportAnnotations are the annotations of a Service or its ServiceExport
// that an export reads (newExported).
var exportAnnotations = []string{annotation.AllowedNamespacesAnnotation, annotation.StaleEndpointsAnnotation}

// slimService is the transform of the Service informer: name, namespace,
// UID, creation time, the export annotation and exportAnnotations, type,
// selector, ports, and what an export entry says of the Service
// (serviceFields): headlessness, session affinity, traffic policies and IP
// families.
func slimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	out := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: svc.Name, Namespace: svc.Namespace, UID: svc.UID, ResourceVersion: svc.ResourceVersion,
			CreationTimestamp: svc.CreationTimestamp,
		},
		Spec: corev1.ServiceSpec{Type: svc.Spec.Type, Selector: svc.Spec.Selector, Ports: svc.Spec.Ports,
			ClusterIP: svc.Spec.ClusterIP, SessionAffinity: svc.Spec.SessionAffinity, SessionAffinityConfig: svc.Spec.SessionAffinityConfig,
			InternalTrafficPolicy: svc.Spec.InternalTrafficPolicy, TrafficDistribution: svc.Spec.TrafficDistribution,
			IPFamilies: svc.Spec.IPFamilies},
	}
	for _, k := range append([]string{annotation.ExportServiceAnnotation}, exportAnnotations...) {
		if v, ok := svc.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out, nil
}

// ownedExport tells whether the annotator wrote the Pod's export
// annotation, signature, endpoint statement or exporter label (and so
// removes them when nothing exports the Pod).
func ownedExport(pod *corev1.Pod) bool {
	return owns(pod, fieldExport) || owns(pod, fieldSignature) || owns(pod, fieldLabel) || ownedEndpoint(pod)
}

// ownedEndpoint tells whether the annotator wrote the Pod's endpoint
// statement or its signature.
func ownedEndpoint(pod *corev1.Pod) bool {
	return owns(pod, fieldEndpoint) || owns(pod, fieldEndpointSignature)
}

// owns tells whether the annotator's managedFields entry lists field.
func owns(pod *corev1.Pod, field []byte) bool {
	for _, mf := range pod.ManagedFields {
		if mf.Manager == FieldManager && mf.FieldsV1 != nil && bytes.Contains(mf.FieldsV1.Raw, field) {
			return true
		}
	}
	return false
}

// importsStandIn replaces a non-blank import annotation's value in the
// informer's store.
const importsStandIn = "(imports)"

// imports tells whether a Pod (as slimPod keeps it) carries a non-blank
// import annotation, and so should carry the importer label.
func imports(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[annotation.ImportAnnotation]
	return ok
}

// inSync tells whether pod already carries, as the annotator would leave
// them, want (the annotation value, or "" for none) with sig (its
// signature, or "" when not signing) and the exporter label (export), and
// the importer label when importer (imports).
func inSync(pod *corev1.Pod, want, sig string, importer bool) (export, imports bool) {
	return exportInSync(pod, want, sig), importerInSync(pod, importer)
}

// importerInSync: a Pod that imports carries the importer label (whoever set
// it); one that does not keeps no importer label the annotator set (one
// that someone else set is theirs).
func importerInSync(pod *corev1.Pod, importer bool) bool {
	if importer {
		return pod.Labels[annotation.ImporterLabel] == annotation.LabelValue
	}
	return !owns(pod, fieldImporter)
}

// exportInSync is inSync for the export annotation, its signature and the
// exporter label.
func exportInSync(pod *corev1.Pod, want, sig string) bool {
	if want == "" {
		return !ownedExport(pod) // what others wrote is theirs
	}
	if pod.Annotations[annotation.ExportAnnotation] != want || pod.Labels[annotation.ExporterLabel] != annotation.LabelValue {
		return false
	}
	haveSig, hasSig := pod.Annotations[annotation.SignatureAnnotation]
	if sig == "" {
		// Not signing (any more): a signature the annotator wrote goes;
		// one that someone else wrote is theirs.
		return !hasSig || !owns(pod, fieldSignature)
	}
	return haveSig == sig
}

// endpointInSync tells whether pod carries the endpoint statement stmt and
// its signature sig, or, with stmt "" (not stating endpoints, or the Pod
// not exported), none that the annotator wrote (one that someone else
// wrote is theirs).
func endpointInSync(pod *corev1.Pod, stmt, sig string) bool {
	if stmt == "" {
		return !ownedEndpoint(pod)
	}
	return pod.Annotations[annotation.EndpointAnnotation] == stmt && pod.Annotations[annotation.EndpointSignatureAnnotation] == sig
}
