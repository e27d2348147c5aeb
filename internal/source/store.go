package source

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// slimFor returns the reflector's transform: a Pod the store holds at the
// same version keeps its slim object (a relist's Pods mostly are), so
// nothing is parsed again and the update that follows changes nothing.
func slimFor(st *ingest.Store[*slimPod], transform func(*v1.Pod) *slimPod) func(*v1.Pod) (runtime.Object, error) {
	return func(pod *v1.Pod) (runtime.Object, error) {
		if old, ok := st.Get(pod.Namespace + "/" + pod.Name); ok && old.Same(ingest.MetaOf(pod)) {
			return old, nil
		}
		return transform(pod), nil
	}
}
