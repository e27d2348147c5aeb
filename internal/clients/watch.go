package clients

import (
	"errors"
	"hash/fnv"
	"net/netip"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// Options tune a Watcher; zero values take the defaults.
type Options struct {
	// All indexes every Pod of the cluster, not only those labelled as
	// importers (for imports enforce, which must know every client's
	// namespace).
	All bool
	// Rejected, if set, hears of bad import annotations once per change.
	Rejected func(namespace, name string, rej []annotation.Rejection)
	// Dropped, if set, hears how many clients remembered from the snapshot
	// the first list did not mention (and the index forgot).
	Dropped func(n int)
	// Ingest tunes the reflector.
	Ingest ingest.Options
}

// Watcher feeds an Index from the local cluster's Pods.
type Watcher struct {
	client kubernetes.Interface
	idx    *Index
	opts   Options

	mu    sync.Mutex // serialises Start and Stop; guards run and store
	run   *ingest.Run
	store *ingest.Store[*slimClient]
}

// NewWatcher returns a watcher; Start starts it.
func NewWatcher(client kubernetes.Interface, idx *Index, opts Options) *Watcher {
	return &Watcher{client: client, idx: idx, opts: opts}
}

// slimClient is what the store keeps of a Pod.
type slimClient struct {
	ingest.Meta
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

func toSlim(pod *v1.Pod) *slimClient {
	s := &slimClient{
		Meta:   ingest.MetaOf(pod),
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
	return s
}

// Start starts the reflector in the background and returns at once.
func (w *Watcher) Start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run != nil {
		return errors.New("watcher already started")
	}
	sel := ""
	if !w.opts.All {
		sel = labels.Set{annotation.ImporterLabel: annotation.LabelValue}.AsSelector().String()
	}
	w.store = w.newStore()
	st := w.store
	slim := func(pod *v1.Pod) (runtime.Object, error) {
		// A Pod held at the same version keeps its slim object.
		if old, ok := st.Get(pod.Namespace + "/" + pod.Name); ok && old.Same(ingest.MetaOf(pod)) {
			return old, nil
		}
		return toSlim(pod), nil
	}
	w.run = ingest.Start(ingest.Pods(w.client, sel, slim), st, w.opts.Ingest)
	return nil
}

// HasSynced reports whether the first list has been indexed.
func (w *Watcher) HasSynced() bool {
	w.mu.Lock()
	st := w.store
	w.mu.Unlock()
	return st != nil && st.Listed()
}

// Stop stops the reflector and waits for it, at most its StopWait: the
// error (wrapping ingest.ErrSlow) says it is still ending in the
// background, harmless.
func (w *Watcher) Stop() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run == nil {
		return nil
	}
	w.store.Close()
	err := w.run.Stop()
	w.run, w.store = nil, nil
	return err
}

// newStore returns the store of a run: it hands each change to the index.
// A complete list forgets the Pods it lacks and, the first time, the
// clients remembered from the snapshot that it did not mention.
func (w *Watcher) newStore() *ingest.Store[*slimClient] {
	st := &ingest.Store[*slimClient]{Changed: w.apply}
	st.Deleted = func(p *slimClient) { w.idx.Remove(p.Namespace, p.Name) }
	st.Replaced = func(old, pods map[string]*slimClient) {
		for k, o := range old {
			if pods[k] == nil {
				w.idx.Remove(o.Namespace, o.Name)
			}
		}
		for k, p := range pods {
			w.apply(old[k], p)
		}
		if old == nil {
			if n := w.idx.DropSeeded(); n > 0 && w.opts.Dropped != nil {
				w.opts.Dropped(n)
			}
		}
	}
	return st
}

// apply indexes p, held before as old (nil if not).
func (w *Watcher) apply(old, p *slimClient) {
	if old == p {
		return // the same version, reused by the transform
	}
	if len(p.rejected) > 0 && w.opts.Rejected != nil && (old == nil || old.annoHash != p.annoHash) {
		w.opts.Rejected(p.Namespace, p.Name, p.rejected)
	}
	if len(p.ips) == 0 {
		w.idx.Remove(p.Namespace, p.Name)
		return
	}
	w.idx.Set(p.client, p.ips)
}
