package clients

import (
	"context"
	"errors"
	"hash/fnv"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/informerstop"
	"github.com/mcsannotations/mcsannotations/internal/podinformer"
	"github.com/mcsannotations/mcsannotations/internal/slimmeta"
)

// Watcher feeds an Index from the local cluster's Pods: only the Pods
// labelled as importers, or every Pod when all is set (for imports enforce,
// which must know every client's namespace).
type Watcher struct {
	client   kubernetes.Interface
	idx      *Index
	all      bool
	rejected func(namespace, name string, rej []annotation.Rejection)
	dropped  func(n int)        // hears how many remembered clients the first list dropped
	informer podinformer.Events // hears what the Pod informer reports
	stopWait time.Duration

	mu      sync.Mutex
	cancel  context.CancelFunc
	factory informers.SharedInformerFactory
	synced  cache.InformerSynced
}

// NewWatcher returns a watcher; rejected (may be nil) hears of bad import
// annotations once per change.
func NewWatcher(client kubernetes.Interface, idx *Index, all bool, rejected func(namespace, name string, rej []annotation.Rejection)) *Watcher {
	return &Watcher{client: client, idx: idx, all: all, rejected: rejected, stopWait: informerstop.Wait}
}

// slimClient is what the informer keeps of a Pod.
type slimClient struct {
	slimmeta.Meta
	client   *Client
	ips      []netip.Addr // nil when the Pod must not be indexed
	annoHash uint64       // of the raw import annotation, to report each change once
	rejected []annotation.Rejection
}

func (p *slimClient) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *slimClient) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

func toSlim(obj any) (any, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return obj, nil
	}
	s := &slimClient{
		Meta:   slimmeta.Of(pod),
		client: &Client{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)},
	}
	if pod.Labels[annotation.ImporterLabel] == annotation.LabelValue {
		raw := pod.Annotations[annotation.ImportAnnotation]
		h := fnv.New64a()
		h.Write([]byte(raw))
		s.annoHash = h.Sum64()
		s.client.Imports, s.rejected = annotation.ParseImports(raw, pod.Namespace)
	}
	// A terminating or finished Pod gives up its IPs: they may be reused. A
	// hostNetwork Pod's IP is its node's, shared by every process on the
	// node (other hostNetwork Pods, a node-local DNS cache): it names no one
	// Pod, so it is never indexed.
	if !pod.Spec.HostNetwork && pod.DeletionTimestamp == nil && pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
		for _, ip := range pod.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil && !contains(s.ips, a.Unmap()) {
				s.ips = append(s.ips, a.Unmap())
			}
		}
	}
	return s, nil
}

// OnDropped registers f to hear how many clients remembered from the
// snapshot the first list did not mention (and the index forgot). Set it
// before Start.
func (w *Watcher) OnDropped(f func(n int)) { w.dropped = f }

// OnInformer registers what the Pod informer reports (a malformed list, an
// expired watch, each list of every Pod after the first; the index stays as
// it was meanwhile). Set it before Start.
func (w *Watcher) OnInformer(ev podinformer.Events) { w.informer = ev }

// SetStopWait bounds how long Stop waits for the informer to end (default
// informerstop.Wait). Set it before Start.
func (w *Watcher) SetStopWait(d time.Duration) {
	if d > 0 {
		w.stopWait = d
	}
}

// Start starts the informer in the background and returns at once.
func (w *Watcher) Start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		return errors.New("watcher already started")
	}
	sel := ""
	if !w.all {
		sel = labels.Set{annotation.ImporterLabel: annotation.LabelValue}.AsSelector().String()
	}
	// With imports enforce, the informer holds every Pod of the cluster.
	factory, inf, err := podinformer.New(w.client, sel, toSlim, w.informer)
	if err != nil {
		return err
	}
	w.factory = factory
	ctx, cancel := context.WithCancel(context.Background())
	reg, err := inf.AddEventHandler(informerstop.Handlers(ctx, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.apply(nil, obj) },
		UpdateFunc: w.apply,
		DeleteFunc: w.onDelete,
	}))
	if err != nil {
		cancel()
		return err
	}
	w.synced = reg.HasSynced
	w.cancel = cancel
	w.factory.Start(ctx.Done())
	go func() {
		// The first list is applied: clients remembered from the snapshot
		// that it did not mention are gone.
		if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			if n := w.idx.DropSeeded(); n > 0 && w.dropped != nil {
				w.dropped(n)
			}
		}
	}()
	return nil
}

// HasSynced reports whether the first list has been indexed.
func (w *Watcher) HasSynced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced != nil && w.synced()
}

// Stop stops the informer and waits for it, at most the stop wait (see
// SetStopWait): the error (wrapping informerstop.ErrSlow) says it is still
// ending in the background, harmless.
func (w *Watcher) Stop() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel == nil {
		return nil
	}
	w.cancel()
	err := informerstop.Shutdown(w.factory, w.stopWait)
	w.cancel, w.factory, w.synced = nil, nil, nil
	return err
}

func (w *Watcher) apply(oldObj, obj any) {
	p, ok := obj.(*slimClient)
	if !ok {
		return
	}
	old, _ := oldObj.(*slimClient)
	if old != nil && old.ResourceVersion == p.ResourceVersion {
		return
	}
	if len(p.rejected) > 0 && w.rejected != nil && (old == nil || old.annoHash != p.annoHash) {
		w.rejected(p.Namespace, p.Name, p.rejected)
	}
	if len(p.ips) == 0 {
		w.idx.Remove(p.Namespace, p.Name)
		return
	}
	w.idx.Set(p.client, p.ips)
}

func (w *Watcher) onDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if m, err := meta(obj); err == nil {
		w.idx.Remove(m.GetNamespace(), m.GetName())
	}
}

func meta(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *slimClient:
		return o, nil
	case metav1.Object:
		return o, nil
	}
	return nil, errors.New("not an object")
}
