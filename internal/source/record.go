package source

import (
	"crypto/ed25519"

	v1 "k8s.io/api/core/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Record is what a source makes of pod, read from cluster: the store record
// (nil exports when the annotation was refused) and what the parse or the
// signature check (with a non-nil key) rejected. It is the informer's own
// transform, for tools that explain an answer (mcsctl).
func Record(cluster string, key ed25519.PublicKey, pod *v1.Pod) (*store.Pod, []annotation.Rejection) {
	p := toSlim(cluster, key)(pod)
	return p.rec, p.rejected
}
