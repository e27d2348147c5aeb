// Package reuse lets a Pod informer skip the transform of a Pod it already
// holds.
//
// A relist (after an API server restart, or an outage longer than its watch
// cache's window) brings every Pod again, and almost every one is the version
// the informer already holds. An informer's transform cuts each decoded Pod
// down to what the plugin keeps; Unchanged hands back the stored object
// instead when the Pod's UID and resource version are the ones it was made
// from: the same version of an object is the same content. Nothing is parsed
// or allocated again, and the event handlers see an update from an object to
// itself, which they ignore.
package reuse

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Unchanged returns transform, except that a Pod that known (the informer's
// store, keyed by namespace/name) holds with the same UID and resource
// version gets the stored object back. A nil known changes nothing.
func Unchanged(known cache.Store, transform cache.TransformFunc) cache.TransformFunc {
	return func(obj any) (any, error) {
		if pod, ok := obj.(*v1.Pod); ok && known != nil && pod.ResourceVersion != "" {
			if old := stored(known, pod); old != nil {
				return old, nil
			}
		}
		return transform(obj)
	}
}

// stored returns what known holds for pod when it was made from the same UID
// and resource version (and is not a raw Pod, which the transform replaces).
func stored(known cache.Store, pod *v1.Pod) any {
	old, ok, err := known.GetByKey(pod.Namespace + "/" + pod.Name)
	if err != nil || !ok {
		return nil
	}
	if _, raw := old.(*v1.Pod); raw {
		return nil
	}
	if m, ok := old.(metav1.Object); ok && m.GetUID() == pod.UID && m.GetResourceVersion() == pod.ResourceVersion {
		return old
	}
	return nil
}
