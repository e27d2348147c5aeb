package source

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// A source with Options.Shared reads its cluster's Pods from an informer
// another component of the process runs (the annotator's, of every local
// Pod), so that the process watches the cluster's Pods once: the exported
// Pods (the exporter label) reach the source's store as a reflector of its
// own would hand them, a complete list first and then each change.

// startShared feeds st from the shared informer: it returns the part's stop.
// The informer's first list reaches the store as one Replace once this
// handler has heard every Pod of it (the registration's HasSynced), so the
// source syncs as after its own first list; every later change is an Update
// or a Delete. A Pod that loses the exporter label is a Delete.
func (f *feed) startShared(st *ingest.Store[*slimPod], transform func(*v1.Pod) (runtime.Object, error)) *part {
	h := &sharedHandler{st: st, transform: transform, initial: map[string]*slimPod{}}
	reg, err := f.s.opts.Shared.AddEventHandler(h)
	if err != nil { // the informer has stopped: the process is stopping
		return &part{stop: func() error { return nil }, store: st}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			h.synced()
		}
	}()
	return &part{store: st, stop: func() error {
		cancel()
		// Asynchronous: a call still under way writes into the store,
		// closed by then, which ignores it.
		return f.s.opts.Shared.RemoveEventHandler(reg)
	}}
}

// sharedHandler hands the shared informer's exported Pods to a store.
// Until the first list is complete it gathers them (initial), then hands
// them over in one Replace.
type sharedHandler struct {
	st        *ingest.Store[*slimPod]
	transform func(*v1.Pod) (runtime.Object, error) // slimFor's

	mu      sync.Mutex
	initial map[string]*slimPod // by key; nil once the first list was handed over
}

func (h *sharedHandler) synced() {
	h.mu.Lock()
	defer h.mu.Unlock()
	list := make([]any, 0, len(h.initial))
	for _, p := range h.initial {
		list = append(list, p)
	}
	h.initial = nil
	_ = h.st.Replace(list, "") // over ingest.MaxObjects: refused, as a reflector's list would be
}

// OnAdd, OnUpdate and OnDelete make sharedHandler a
// cache.ResourceEventHandler; the informer calls them one at a time.
func (h *sharedHandler) OnAdd(obj any, _ bool) { h.upsert(obj) }
func (h *sharedHandler) OnUpdate(_, obj any)   { h.upsert(obj) }
func (h *sharedHandler) OnDelete(obj any)      { h.delete(obj) }

// exported tells whether pod carries the exporter label, which the source's
// own reflectors select by.
func exported(pod *v1.Pod) bool {
	return pod.Labels[annotation.ExporterLabel] == annotation.LabelValue
}

func (h *sharedHandler) upsert(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if !exported(pod) {
		h.delete(pod)
		return
	}
	o, _ := h.transform(pod)
	p := o.(*slimPod)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.initial != nil {
		h.initial[p.Key()] = p
		return
	}
	_ = h.st.Update(p)
}

func (h *sharedHandler) delete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	k := pod.Namespace + "/" + pod.Name
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.initial != nil {
		delete(h.initial, k)
		return
	}
	if p, ok := h.st.Get(k); ok {
		_ = h.st.Delete(p)
	}
}
