package ingest

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// Meta is the object metadata of a slim object: its key, and the resource
// version the reflector reads. Embed it; a metav1.ObjectMeta is some 240
// bytes of mostly empty fields in every stored object.
type Meta struct {
	Namespace, Name, ResourceVersion string
	UID                              types.UID
}

// MetaOf returns the Meta of m.
func MetaOf(m metav1.Object) Meta {
	return Meta{Namespace: m.GetNamespace(), Name: m.GetName(), ResourceVersion: m.GetResourceVersion(), UID: m.GetUID()}
}

// GetObjectMeta implements metav1.ObjectMetaAccessor, which the reflector
// reads each watch event's resource version through.
func (m *Meta) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, ResourceVersion: m.ResourceVersion, UID: m.UID}
}

// Same reports whether o was made from the same object at the same version:
// then it has the same content.
func (m *Meta) Same(o Meta) bool {
	return m.UID == o.UID && m.ResourceVersion != "" && m.ResourceVersion == o.ResourceVersion
}

// Streamer lists the Pods of one namespace (all when it is empty) one at a
// time as they arrive, as podproto's client does.
type Streamer interface {
	ListPodsIn(ctx context.Context, namespace string, opts metav1.ListOptions, each func(*v1.Pod) error) (metav1.ListMeta, error)
}

// Pods returns the ListerWatcher of the Pods that selector (a label
// selector; empty for all) matches in every namespace, each cut down by
// transform. A client that is a Streamer (podproto's) lists through it, and
// each Pod is transformed as it arrives: a relist holds one Pod's bytes at a
// time and the slim objects, never the whole response nor its full Pods.
func Pods(client kubernetes.Interface, selector string, transform func(*v1.Pod) (runtime.Object, error)) *ListerWatcher {
	return PodsIn(client, metav1.NamespaceAll, selector, transform)
}

// PodsIn is Pods in one namespace: its list and watch need a grant in that
// namespace only (a RoleBinding), where Pods needs a cluster-wide one.
func PodsIn(client kubernetes.Interface, namespace, selector string, transform func(*v1.Pod) (runtime.Object, error)) *ListerWatcher {
	pods := client.CoreV1().Pods(namespace)
	lw := typed(transform, func(opts *metav1.ListOptions) { opts.LabelSelector = selector }, pods.List, pods.Watch)
	if s, ok := client.(Streamer); ok {
		lw.ListWithContextFunc = func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return transformedList(transform, func(each func(*v1.Pod) error) (metav1.ListMeta, error) {
				return s.ListPodsIn(ctx, namespace, opts, each)
			})
		}
	}
	return lw
}

// ConfigMap returns the ListerWatcher of the one ConfigMap namespace/name
// (a field selector on its name, which RBAC's resourceNames can grant),
// each cut down by transform.
func ConfigMap(client kubernetes.Interface, namespace, name string, transform func(*v1.ConfigMap) (runtime.Object, error)) *ListerWatcher {
	cms := client.CoreV1().ConfigMaps(namespace)
	field := fields.OneTermEqualSelector("metadata.name", name).String()
	return typed(transform, func(opts *metav1.ListOptions) { opts.FieldSelector = field }, cms.List, cms.Watch)
}

// transformedList returns the List of the objects that list hands to its
// each one at a time, each transformed as it arrives; a list of more than
// MaxObjects is refused as it arrives.
func transformedList[T any](transform func(T) (runtime.Object, error), list func(each func(T) error) (metav1.ListMeta, error)) (runtime.Object, error) {
	l := &List{}
	meta, err := list(func(obj T) error {
		if len(l.Items) >= MaxObjects {
			return fmt.Errorf("%w: %w: a list of more than %d objects", podproto.ErrStream, ErrTooLarge, MaxObjects)
		}
		t, err := transform(obj)
		if err == nil {
			l.Items = append(l.Items, t)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	l.ListMeta = meta
	return l, nil
}

// typed returns the ListerWatcher of objects of type T, listed with list
// and watched with watch, each with the options that selects sets, and
// cut down by transform.
func typed[T runtime.Object, L runtime.Object](transform func(T) (runtime.Object, error), selects func(*metav1.ListOptions),
	list func(context.Context, metav1.ListOptions) (L, error), watchf func(context.Context, metav1.ListOptions) (watch.Interface, error)) *ListerWatcher {
	return &ListerWatcher{
		Transform: func(obj runtime.Object) (runtime.Object, error) {
			if t, ok := obj.(T); ok {
				return transform(t)
			}
			var want T
			return nil, fmt.Errorf("a %T where a %T was expected", obj, want)
		},
		ListWatch: cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				selects(&opts)
				return list(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				selects(&opts)
				return watchf(ctx, opts)
			},
		},
	}
}
