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
	store *clientStore
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

func (p *slimClient) key() string { return p.Namespace + "/" + p.Name }

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
	w.store = &clientStore{w: w, pods: map[string]*slimClient{}}
	w.run = ingest.Start(ingest.Pods(w.client, sel, w.store.slim), w.store, w.opts.Ingest)
	return nil
}

// HasSynced reports whether the first list has been indexed.
func (w *Watcher) HasSynced() bool {
	w.mu.Lock()
	st := w.store
	w.mu.Unlock()
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.listed
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
	w.store.close()
	err := w.run.Stop()
	w.run, w.store = nil, nil
	return err
}

// clientStore is the store the watcher's reflector writes into: it keeps
// the slim Pods by key and hands each change to the index.
type clientStore struct {
	w      *Watcher
	mu     sync.Mutex // guards the fields below; held while the index changes
	closed bool       // the run is stopped: the index is left alone
	listed bool       // a complete list was indexed
	pods   map[string]*slimClient
}

func (st *clientStore) close() {
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
}

// slim is the reflector's transform: a Pod held at the same version keeps
// its slim object.
func (st *clientStore) slim(pod *v1.Pod) (runtime.Object, error) {
	st.mu.Lock()
	old := st.pods[pod.Namespace+"/"+pod.Name]
	st.mu.Unlock()
	if old != nil && old.Same(ingest.MetaOf(pod)) {
		return old, nil
	}
	return toSlim(pod), nil
}

func (st *clientStore) Add(obj any) error { return st.Update(obj) }

func (st *clientStore) Update(obj any) error {
	p, ok := obj.(*slimClient)
	if !ok {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	old := st.pods[p.key()]
	st.pods[p.key()] = p
	st.apply(old, p)
	return nil
}

func (st *clientStore) Delete(obj any) error {
	p, ok := obj.(*slimClient)
	if !ok {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	delete(st.pods, p.key())
	st.w.idx.Remove(p.Namespace, p.Name)
	return nil
}

// Replace indexes a complete list: Pods it lacks are forgotten, and after
// the first, so are the clients remembered from the snapshot that it did
// not mention.
func (st *clientStore) Replace(items []any, _ string) error {
	pods := make(map[string]*slimClient, len(items))
	for _, obj := range items {
		if p, ok := obj.(*slimClient); ok {
			pods[p.key()] = p
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	for k, o := range st.pods {
		if pods[k] == nil {
			st.w.idx.Remove(o.Namespace, o.Name)
		}
	}
	old := st.pods
	st.pods = pods
	for k, p := range pods {
		st.apply(old[k], p)
	}
	if !st.listed {
		st.listed = true
		if n := st.w.idx.DropSeeded(); n > 0 && st.w.opts.Dropped != nil {
			st.w.opts.Dropped(n)
		}
	}
	return nil
}

func (st *clientStore) Resync() error { return nil }

// apply indexes p, held before as old (nil if not); st.mu is held.
func (st *clientStore) apply(old, p *slimClient) {
	if old == p {
		return // the same version, reused by slim
	}
	if len(p.rejected) > 0 && st.w.opts.Rejected != nil && (old == nil || old.annoHash != p.annoHash) {
		st.w.opts.Rejected(p.Namespace, p.Name, p.rejected)
	}
	if len(p.ips) == 0 {
		st.w.idx.Remove(p.Namespace, p.Name)
		return
	}
	st.w.idx.Set(p.client, p.ips)
}
