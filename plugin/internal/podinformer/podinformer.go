// Package podinformer builds the Pod informers of the sources and of the
// clients watcher.
package podinformer

import (
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/plugin/internal/reuse"
)

// New returns a factory and its informer of the Pods that selector (a label
// selector; empty for all) matches, in every namespace. Each Pod is stored as
// transform makes it, and a relist's unchanged Pods keep their stored
// objects (see reuse). Unlike the factory's own Pod informer, it keeps no
// index by namespace: nothing here looks Pods up by namespace, and the index
// costs an entry per Pod.
func New(client kubernetes.Interface, selector string, transform cache.TransformFunc) (informers.SharedInformerFactory, cache.SharedIndexInformer, error) {
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = selector }
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.InformerFor(&v1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPodInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	if err := inf.SetTransform(reuse.Unchanged(inf.GetStore(), transform)); err != nil {
		return nil, nil, err
	}
	return factory, inf, nil
}
