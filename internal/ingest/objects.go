package ingest

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// EndpointSlices returns the ListerWatcher of the EndpointSlices that
// selector (a label selector) matches in namespace (every namespace when
// it is metav1.NamespaceAll), each cut down by transform.
func EndpointSlices(client kubernetes.Interface, namespace, selector string, transform func(*discoveryv1.EndpointSlice) (runtime.Object, error)) *ListerWatcher {
	es := client.DiscoveryV1().EndpointSlices(namespace)
	return typed(transform, func(opts *metav1.ListOptions) { opts.LabelSelector = selector }, es.List, es.Watch)
}

// Leases returns the ListerWatcher of the Leases that selector (a label
// selector) matches in namespace, each cut down by transform.
func Leases(client kubernetes.Interface, namespace, selector string, transform func(*coordinationv1.Lease) (runtime.Object, error)) *ListerWatcher {
	ls := client.CoordinationV1().Leases(namespace)
	return typed(transform, func(opts *metav1.ListOptions) { opts.LabelSelector = selector }, ls.List, ls.Watch)
}

// Lease returns the ListerWatcher of the one Lease namespace/name (a field
// selector on its name, which RBAC's resourceNames can grant), each cut
// down by transform.
func Lease(client kubernetes.Interface, namespace, name string, transform func(*coordinationv1.Lease) (runtime.Object, error)) *ListerWatcher {
	ls := client.CoordinationV1().Leases(namespace)
	field := fields.OneTermEqualSelector("metadata.name", name).String()
	return typed(transform, func(opts *metav1.ListOptions) { opts.FieldSelector = field }, ls.List, ls.Watch)
}
