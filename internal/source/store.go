package source

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mcsannotations/mcsannotations/internal/ingest"

	"github.com/mcsannotations/mcsannotations/internal/table"
)

// podStore is the store the source's reflector writes into: it keeps the
// slim Pods by key and hands each change to the table. A complete list
// replaces the cluster's records in one step (table.ReplaceCluster), so no
// answer ever mixes a list with what it replaces.
type podStore struct {
	s         *Source
	transform func(*v1.Pod) *slimPod
	closed    bool // under s.evMu: the run is stopped, the table is left alone

	mu     sync.Mutex // guards pods: slim reads it from the list's goroutine
	pods   map[string]*slimPod
	listed bool // a complete list was applied
}

// slim is the reflector's transform: a Pod the store holds at the same
// version keeps its slim object (a relist's Pods mostly are), so nothing is
// parsed again and the update that follows changes nothing.
func (st *podStore) slim(pod *v1.Pod) (runtime.Object, error) {
	st.mu.Lock()
	old := st.pods[pod.Namespace+"/"+pod.Name]
	st.mu.Unlock()
	if old != nil && old.Same(ingest.MetaOf(pod)) {
		return old, nil
	}
	return st.transform(pod), nil
}

func (st *podStore) Add(obj any) error { return st.Update(obj) }

func (st *podStore) Update(obj any) error {
	p, ok := obj.(*slimPod)
	if !ok {
		return nil
	}
	st.s.evMu.Lock()
	defer st.s.evMu.Unlock()
	if st.closed {
		return nil
	}
	st.mu.Lock()
	old := st.pods[p.key()]
	st.pods[p.key()] = p
	st.mu.Unlock()
	st.s.touch()
	if old == p {
		return nil // the same version, reused by slim
	}
	if old == nil || old.annoHash != p.annoHash {
		st.s.reject(p)
	}
	if old == nil || !old.rec.Equal(p.rec) {
		st.s.table.Upsert(p.rec)
	}
	return nil
}

func (st *podStore) Delete(obj any) error {
	p, ok := obj.(*slimPod)
	if !ok {
		return nil
	}
	st.s.evMu.Lock()
	defer st.s.evMu.Unlock()
	if st.closed {
		return nil
	}
	st.mu.Lock()
	delete(st.pods, p.key())
	st.mu.Unlock()
	st.s.touch()
	st.s.table.Delete(p.rec.Key())
	return nil
}

// Replace applies a complete list: the cluster's records become its Pods'
// (those from a snapshot, or from before an outage, that it lacks go).
func (st *podStore) Replace(items []any, _ string) error {
	pods := make(map[string]*slimPod, len(items))
	recs := make([]*table.Pod, 0, len(items))
	for _, obj := range items {
		if p, ok := obj.(*slimPod); ok {
			pods[p.key()] = p
			recs = append(recs, p.rec)
		}
	}
	st.s.evMu.Lock()
	defer st.s.evMu.Unlock()
	if st.closed {
		return nil
	}
	st.mu.Lock()
	old := st.pods
	st.pods = pods
	st.mu.Unlock()
	for k, p := range pods {
		if o := old[k]; o == nil || o.annoHash != p.annoHash {
			st.s.reject(p)
		}
	}
	st.s.table.ReplaceCluster(st.s.cluster, recs)
	first := !st.listed
	st.listed = true
	st.s.listed(first)
	return nil
}

func (st *podStore) Resync() error { return nil }
