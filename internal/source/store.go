package source

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// newStore returns the store of one run of the reflector: it hands each
// change to the table. A complete list replaces the cluster's records in one
// step (table.ReplaceCluster), so no answer ever mixes a list with what it
// replaces; the records (from a snapshot, or from before an outage) that it
// lacks go.
func (s *Source) newStore() *ingest.Store[*slimPod] {
	st := &ingest.Store[*slimPod]{}
	st.Changed = func(old, p *slimPod) {
		s.touch()
		if old == p {
			return // the same version, reused by the transform
		}
		if old == nil || old.annoHash != p.annoHash {
			s.reject(p)
		}
		if old == nil || !old.rec.Equal(p.rec) {
			s.table.Upsert(p.rec)
		}
	}
	st.Deleted = func(p *slimPod) {
		s.touch()
		s.table.Delete(p.rec.Key())
	}
	st.Replaced = func(old, pods map[string]*slimPod) {
		recs := make([]*table.Pod, 0, len(pods))
		for k, p := range pods {
			if o := old[k]; o == nil || o.annoHash != p.annoHash {
				s.reject(p)
			}
			recs = append(recs, p.rec)
		}
		s.table.ReplaceCluster(s.cluster, recs)
		s.listed(old == nil)
	}
	return st
}

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
