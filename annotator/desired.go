package annotator

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Reasons an export (or a port of one) is left out; metric label values.
const (
	skipExternalName    = "external_name"      // an ExternalName Service has no Pods to export
	skipPortUnresolved  = "port_unresolved"    // a named targetPort the Pod does not declare
	skipPortName        = "port_name"          // a Service port name that is no IANA service name: exported unnamed (no SRV name)
	skipTooManyServices = "too_many_services"  // more exported Services select the Pod than an annotation may list
	skipTooManyPorts    = "too_many_ports"     // a Service has more ports than an entry may list
	skipTooLarge        = "too_large"          // the annotation would pass the readers' size limit
	skipInvalid         = "invalid"            // a reader would reject what would be written
	skipAllowed         = "allowed_namespaces" // an allowed-namespaces annotation that does not parse: own namespace only
	skipStale           = "stale_endpoints"    // a stale-endpoints annotation that does not parse: exported without a policy (serve)
)

var skipReasons = []string{skipExternalName, skipPortUnresolved, skipPortName, skipTooManyServices, skipTooManyPorts, skipTooLarge, skipInvalid, skipAllowed, skipStale}

// skip is one thing left out of a Pod's annotation, for the log and the metric.
type skip struct {
	reason string
	key    string // what it is about, stable across reconciles: logged once while it lasts
	detail string
}

// exported is an exported Service with its selector parsed once.
type exported struct {
	svc      *corev1.Service
	selector labels.Selector    // nil: the Service selects no Pods
	fields   annotation.Service // what each entry says of the Service (fields.go)
	allowed  []string           // other namespaces allowed to import it (annotation.Export.Allowed)
}

// parseAllowed reads an allowed-namespaces annotation: namespaces separated
// by commas (spaces around them ignored), or "*". An error leaves nil: the
// service's own namespace only.
func parseAllowed(raw string) ([]string, error) {
	var list []string
	for _, ns := range strings.Split(raw, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			list = append(list, ns)
		}
	}
	return annotation.CheckAllowed(list)
}

// isExported is the rule of what is exported, which both the reconcile and
// the grants apply: a Service annotated export "true", or named by a
// ServiceExport (byServiceExport), unless it is an ExternalName Service,
// which has no Pods to export (refused: asked for, and left out).
func isExported(svc *corev1.Service, byServiceExport bool) (ok, refused bool) {
	if svc.Annotations[annotation.ExportServiceAnnotation] != annotation.LabelValue && !byServiceExport {
		return false, false
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false, true
	}
	return true, false
}

// newExported prepares svc, exported by se (nil: by annotation). Its
// allowed namespaces and its stale policy are the ServiceExport's
// annotations when it has them, else the Service's (exportAnnotation). An
// allowed-namespaces value that does not parse leaves the Service's own
// namespace only; a stale-endpoints value that does not parse leaves the
// entry without a policy, which consumers read as serve, the default: the
// value is not guessed at, and an export that worked is not withdrawn over
// a typo in an optional annotation. Either is a skip returned, for the log
// and the metric.
func newExported(svc *corev1.Service, se *unstructured.Unstructured) (exported, []skip) {
	e := exported{svc: svc, fields: serviceFields(svc, se)}
	if len(svc.Spec.Selector) > 0 {
		e.selector = labels.SelectorFromValidatedSet(svc.Spec.Selector)
	}
	var skips []skip
	raw, _ := exportAnnotation(svc, se, annotation.AllowedNamespacesAnnotation)
	var err error
	if e.allowed, err = parseAllowed(raw); err != nil {
		skips = append(skips, skip{skipAllowed, svc.Name, fmt.Sprintf("Service %s/%s: %s %q ignored (own namespace only): %v",
			svc.Namespace, svc.Name, annotation.AllowedNamespacesAnnotation, annotation.Clip(raw), err)})
	}
	if raw, ok := exportAnnotation(svc, se, annotation.StaleEndpointsAnnotation); ok {
		policy, grace, err := annotation.ParseStaleEndpoints(raw)
		if err != nil {
			skips = append(skips, skip{skipStale, svc.Name, fmt.Sprintf("Service %s/%s: %s ignored (exported without a stale policy: consumers serve its endpoints of an unreachable cluster, the default): %v",
				svc.Namespace, svc.Name, annotation.StaleEndpointsAnnotation, err)})
		} else {
			e.fields.StaleEndpoints, e.fields.StaleGraceSeconds = policy, grace
		}
	}
	return e, skips
}

// exportAnnotation returns the annotation key of an export: the
// ServiceExport's when it has the key (even empty), else the Service's.
func exportAnnotation(svc *corev1.Service, se *unstructured.Unstructured, key string) (string, bool) {
	if se != nil {
		if v, ok := se.GetAnnotations()[key]; ok {
			return v, true
		}
	}
	v, ok := svc.Annotations[key]
	return v, ok
}

// selects tells whether the Service selects pod (same namespace assumed).
func (e exported) selects(pod *corev1.Pod) bool {
	return e.selector != nil && e.selector.Matches(labels.Set(pod.Labels))
}

// writable tells whether the annotator writes to pod at all: Pods that have
// ended or are being deleted never back a service again.
func writable(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// checker checks annotation values the way readers will
// (annotation.CheckExports), for the Pods of one namespace, remembering each
// value's verdict: the Pods of one Service carry one value, and the check (a
// parse) is most of what computing a Pod's annotation costs.
type checker struct {
	namespace, cluster string // cluster: a valid ID to check entries without one against
	seen               map[string]error
}

func newChecker(namespace, cluster string) *checker {
	if cluster == "" {
		cluster = "local" // entries without a cluster: a reader defaults it to a valid ID of its own
	}
	return &checker{namespace: namespace, cluster: cluster, seen: map[string]error{}}
}

// format writes exports and checks the value.
func (c *checker) format(exports []annotation.Export) (string, error) {
	raw, err := annotation.MarshalExports(exports)
	if err != nil {
		return "", err
	}
	verdict, ok := c.seen[raw]
	if !ok {
		verdict = annotation.CheckExports(raw, len(exports), c.namespace, c.cluster)
		c.seen[raw] = verdict
	}
	if verdict != nil {
		return "", verdict
	}
	return raw, nil
}

// desired returns the value of the export annotation pod should carry, given
// the exported Services of its namespace (sorted by name), or "" when none
// selects it, and what was left out. cluster is written into each entry when
// not empty; chk is the namespace's checker.
func desired(pod *corev1.Pod, services []exported, cluster string, chk *checker) (string, []string, []skip) {
	var exports []annotation.Export
	var names []string
	var skips []skip
	for _, e := range services {
		if !e.selects(pod) {
			continue
		}
		if len(exports) == annotation.MaxServices {
			skips = append(skips, skip{skipTooManyServices, pod.Name + "/" + e.svc.Name,
				fmt.Sprintf("Pod %s/%s: Service %s left out: more than %d exported Services select the Pod", pod.Namespace, pod.Name, e.svc.Name, annotation.MaxServices)})
			continue
		}
		ports, pskips := exportPorts(pod, e.svc)
		skips = append(skips, pskips...)
		exports = append(exports, annotation.Export{Name: e.svc.Name, Namespace: pod.Namespace, Cluster: cluster, Ports: ports, Allowed: e.allowed, Service: e.fields})
		names = append(names, e.svc.Name)
	}
	if len(exports) == 0 {
		return "", nil, skips
	}
	for len(exports) > 0 {
		raw, err := chk.format(exports)
		if err == nil {
			return raw, names, skips
		}
		var fe *annotation.FormatError
		if !errors.As(err, &fe) || fe.Rejection.Reason != annotation.ReasonSize {
			return "", nil, append(skips, skip{skipInvalid, pod.Name,
				fmt.Sprintf("Pod %s/%s: not annotated: %v", pod.Namespace, pod.Name, err)})
		}
		last := len(exports) - 1
		skips = append(skips, skip{skipTooLarge, pod.Name + "/" + exports[last].Name,
			fmt.Sprintf("Pod %s/%s: Service %s left out: the annotation would be larger than %d bytes", pod.Namespace, pod.Name, exports[last].Name, annotation.MaxBytes)})
		exports, names = exports[:last], names[:last]
	}
	return "", nil, skips
}

// exportPorts returns the Service's ports as pod serves them: targetPort
// resolved against the Pod's container ports as the endpoints controller
// does (a number as it is, unset as the port, a name to the container port
// of that name and protocol). A named targetPort the Pod does not declare
// leaves that port out for this Pod.
func exportPorts(pod *corev1.Pod, svc *corev1.Service) ([]annotation.Port, []skip) {
	var out []annotation.Port
	var skips []skip
	for _, sp := range svc.Spec.Ports {
		if len(out) == annotation.MaxPortsPerExport {
			skips = append(skips, skip{skipTooManyPorts, pod.Name + "/" + svc.Name,
				fmt.Sprintf("Pod %s/%s: Service %s: ports after the first %d left out: a reader refuses an entry with more", pod.Namespace, pod.Name, svc.Name, annotation.MaxPortsPerExport)})
			break
		}
		proto := string(sp.Protocol)
		if proto == "" {
			proto = annotation.TCP
		}
		target, ok := targetPort(pod, sp.TargetPort, sp.Port, corev1.Protocol(proto))
		if !ok {
			skips = append(skips, skip{skipPortUnresolved, pod.Name + "/" + svc.Name + "/" + sp.Name,
				fmt.Sprintf("Pod %s/%s: port %q of Service %s left out: the Pod declares no %s container port named %q", pod.Namespace, pod.Name, sp.Name, svc.Name, proto, sp.TargetPort.StrVal)})
			continue
		}
		name := sp.Name
		if name != "" && len(validation.IsValidPortName(name)) > 0 {
			// Service port names are DNS labels; SRV names take IANA service
			// names (readers refuse others), so the port goes without one.
			skips = append(skips, skip{skipPortName, pod.Name + "/" + svc.Name + "/" + sp.Name,
				fmt.Sprintf("Pod %s/%s: port %q of Service %s exported without its name (no SRV name): %s", pod.Namespace, pod.Name, sp.Name, svc.Name,
					strings.Join(validation.IsValidPortName(name), "; "))})
			name = ""
		}
		out = append(out, annotation.Port{Name: name, Port: sp.Port, TargetPort: target, Protocol: proto, AppProtocol: ptrString(sp.AppProtocol)})
	}
	return out, skips
}

func targetPort(pod *corev1.Pod, tp intstr.IntOrString, port int32, proto corev1.Protocol) (int32, bool) {
	if tp.Type == intstr.String && tp.StrVal != "" {
		return containerPort(pod, tp.StrVal, proto)
	}
	if tp.Type == intstr.Int && tp.IntVal != 0 {
		return tp.IntVal, true
	}
	return port, true
}

// containerPort finds the port named name in pod's containers and its
// sidecars (init containers that keep running), as Services do.
func containerPort(pod *corev1.Pod, name string, proto corev1.Protocol) (int32, bool) {
	find := func(cs []corev1.Container, sidecarsOnly bool) (int32, bool) {
		for _, c := range cs {
			if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, p := range c.Ports {
				pp := p.Protocol
				if pp == "" {
					pp = corev1.ProtocolTCP
				}
				if p.Name == name && pp == proto {
					return p.ContainerPort, true
				}
			}
		}
		return 0, false
	}
	if v, ok := find(pod.Spec.Containers, false); ok {
		return v, true
	}
	return find(pod.Spec.InitContainers, true)
}

// sortServices orders exported Services by name, so that annotations are
// written the same way every time.
func sortServices(s []exported) {
	slices.SortFunc(s, func(a, b exported) int { return strings.Compare(a.svc.Name, b.svc.Name) })
}
