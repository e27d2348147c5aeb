package source

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Scope is what a source reads: the exported Pods of the namespaces listed,
// or of every namespace.
type Scope struct {
	// ClusterWide: one watch of every namespace; Namespaces is nil.
	ClusterWide bool
	// Namespaces are watched one by one, sorted (none: the cluster exports
	// nothing).
	Namespaces []string
	// Why says why a scoped source reads cluster-wide ("" when it does not).
	Why string
	// Ignored are entries of the published list that are no namespace name.
	Ignored []string
}

// Why a scoped source reads cluster-wide.
const (
	WhyNoList    = "the cluster publishes no list of exporting namespaces (an annotator older than the list, or none)"
	WhyForbidden = "the list of exporting namespaces may not be read (the credential predates it)"
	WhyTooMany   = "more exporting namespaces than MaxNamespaces"
)

// part is one reflector of a feed: the exported Pods of one namespace, or
// of every namespace (name ""); with Options.Shared, the handler on the
// shared informer that stands in for the reflector (shared.go).
type part struct {
	stop  func() error // the reflector's Stop
	store *ingest.Store[*slimPod]
}

// feed is one run of a source (from Start or Expire until Stop or Expire):
// its parts and the records they make together. Unscoped it has one part,
// cluster-wide. Scoped it follows the published list of exporting
// namespaces and runs one part per namespace, or a cluster-wide one when
// there is no list.
//
// The cluster's records are swapped in one step (store.ReplaceCluster)
// whenever a part lists or goes: the listed parts' Pods, and for a part
// that has not listed yet (just added) what the record store holds of its
// namespaces, so that a namespace added, or a switch between cluster-wide
// and per namespace, never empties an answer until its own list arrives. A
// namespace that leaves the list loses its records at once. Nothing is
// removed while the API server does not answer: a part removed is one the
// server's own list dropped.
type feed struct {
	s    *Source
	opts ingest.Options // of every reflector; Failed turns the source Disconnected

	mu     sync.Mutex
	known  bool                           // the parts are decided: unscoped, or the list was read
	items  map[string]map[string]*slimPod // by part name; nil until it listed once
	synced bool                           // every part listed once in this run

	// parts is only touched by the loop, or by start and stop when there
	// is no loop.
	parts map[string]*part

	// Scoped only: the reflector of the list, the loop that follows it.
	list    *ingest.Run
	listSt  *ingest.Store[*nsList]
	cancel  context.CancelFunc
	done    chan struct{}
	wake    chan struct{}
	pmu     sync.Mutex
	pending *Scope // the latest scope the list asked for, not applied yet
	denied  bool   // the list read was forbidden

	current  Scope // applied last (under mu)
	hasScope bool
}

// startFeed starts a run of s; s.mu is held.
func (s *Source) startFeed() *feed {
	opts := s.opts.Ingest
	failed := opts.Events.Failed
	opts.Events.Failed = func(err error) {
		s.setState(Disconnected, err)
		if failed != nil {
			failed(err)
		}
	}
	f := &feed{s: s, opts: opts, items: map[string]map[string]*slimPod{}, parts: map[string]*part{}}
	if !s.opts.Scoped || s.opts.Shared != nil {
		f.known = true
		f.items[""] = nil
		f.parts[""] = f.startPart("")
		return f
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done, f.wake = cancel, make(chan struct{}), make(chan struct{}, 1)
	f.startList()
	go f.loop(ctx)
	return f
}

// startPart starts the reflector of the exported Pods of namespace ns (""
// for all).
func (f *feed) startPart(ns string) *part {
	st := f.newStore(ns)
	transform := toSlimProof(f.s.cluster, f.s.opts.Key, f.s.opts.KeepProof)
	if f.s.opts.Shared != nil {
		return f.startShared(st, slimFor(st, transform))
	}
	selector := labels.Set{annotation.ExporterLabel: annotation.LabelValue}.AsSelector().String()
	lw := ingest.PodsIn(f.s.client, ns, selector, slimFor(st, transform))
	return &part{stop: ingest.Start(lw, st, f.opts).Stop, store: st}
}

// stop stops every reflector of the run and waits for them, each at most
// its StopWait (the error wraps ingest.ErrSlow then).
func (f *feed) stop() error {
	var errs []error
	if f.cancel != nil {
		f.cancel()
		<-f.done // the loop no longer changes the list's run nor the parts
		f.listSt.Close()
		errs = append(errs, f.list.Stop())
	}
	errs = append(errs, stopParts(slices.Collect(maps.Values(f.parts))))
	return errors.Join(errs...)
}

// stopParts stops parts all at once: each may take its StopWait.
func stopParts(parts []*part) error {
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		p.store.Close()
		wg.Go(func() { errs[i] = p.stop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// newStore returns the store of part name: it hands each change to the
// record store, and each complete list to the feed's swap.
func (f *feed) newStore(name string) *ingest.Store[*slimPod] {
	s := f.s
	st := &ingest.Store[*slimPod]{}
	st.Changed = func(old, p *slimPod) {
		s.touch()
		if old == p {
			return // the same version, reused by the transform
		}
		if old == nil || old.annoHash != p.annoHash {
			s.reject(p)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		m := f.items[name]
		if m == nil {
			return // the part is gone from the feed
		}
		m[p.Key()] = p
		if old == nil || !old.rec.Equal(p.rec) {
			s.records.Upsert(p.rec)
		}
	}
	st.Deleted = func(p *slimPod) {
		s.touch()
		f.mu.Lock()
		defer f.mu.Unlock()
		m := f.items[name]
		if m == nil {
			return
		}
		delete(m, p.Key())
		s.records.Delete(p.rec.Key())
	}
	st.Replaced = func(old, pods map[string]*slimPod) {
		for k, p := range pods {
			if o := old[k]; o == nil || o.annoHash != p.annoHash {
				s.reject(p)
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.items[name]; !ok {
			return
		}
		f.items[name] = maps.Clone(pods) // the store changes its own map
		f.swapLocked()
	}
	return st
}

// swapLocked replaces the cluster's records with what the parts make (see
// feed); f.mu is held. Once every part has listed, the source has synced.
func (f *feed) swapLocked() {
	if !f.known {
		return
	}
	n, listed := 0, true
	for _, m := range f.items {
		n += len(m)
		listed = listed && m != nil
	}
	recs := make([]*store.Pod, 0, n)
	for _, m := range f.items {
		for _, p := range m {
			recs = append(recs, p.rec)
		}
	}
	if !listed {
		for _, r := range f.s.records.Pods(f.s.cluster) {
			m, ok := f.items[r.Namespace]
			if !ok {
				m, ok = f.items[""]
			}
			if ok && m == nil {
				recs = append(recs, r) // its part has not listed yet
			}
		}
	}
	f.s.records.ReplaceCluster(f.s.cluster, recs)
	if listed {
		f.s.listed(!f.synced)
		f.synced = true
	}
}

// startList starts the reflector of the published list.
func (f *feed) startList() {
	f.listSt = &ingest.Store[*nsList]{}
	f.listSt.Replaced = func(_, objs map[string]*nsList) {
		if l := objs[ExportingNamespacesNamespace+"/"+ExportingNamespacesName]; l != nil {
			f.want(l.scope(f.s.opts.MaxNamespaces))
			return
		}
		f.want(Scope{ClusterWide: true, Why: WhyNoList})
	}
	f.listSt.Changed = func(_, l *nsList) { f.want(l.scope(f.s.opts.MaxNamespaces)) }
	f.listSt.Deleted = func(*nsList) { f.want(Scope{ClusterWide: true, Why: WhyNoList}) }
	opts := f.opts
	failed := opts.Events.Failed
	opts.Events.Failed = func(err error) {
		if apierrors.IsForbidden(err) {
			f.pmu.Lock()
			f.denied = true
			f.pmu.Unlock()
			f.signal()
			return
		}
		failed(err)
	}
	lw := ingest.ConfigMap(f.s.client, ExportingNamespacesNamespace, ExportingNamespacesName, transformList)
	f.list = ingest.Start(lw, f.listSt, opts)
}

// want asks the loop for scope.
func (f *feed) want(sc Scope) {
	f.pmu.Lock()
	f.pending, f.denied = &sc, false
	f.pmu.Unlock()
	f.signal()
}

func (f *feed) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// loop applies each scope the list asks for. When the list may not be read
// it reads cluster-wide, stops asking, and asks again every RecheckList.
func (f *feed) loop(ctx context.Context) {
	defer close(f.done)
	var recheck <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-recheck:
			recheck = nil
			f.startList()
			continue
		case <-f.wake:
		}
		f.pmu.Lock()
		sc, denied := f.pending, f.denied
		f.pending, f.denied = nil, false
		f.pmu.Unlock()
		if denied && recheck == nil {
			f.listSt.Close()
			_ = f.list.Stop() // it ends in the background if slow; its store is closed
			recheck = time.After(f.s.opts.RecheckList)
			sc = &Scope{ClusterWide: true, Why: WhyForbidden}
		}
		if sc != nil {
			f.apply(*sc)
		}
	}
}

// apply makes the parts those of sc; only the loop calls it.
func (f *feed) apply(sc Scope) {
	want := sc.Namespaces
	if sc.ClusterWide {
		want = []string{""}
	}
	var gone []*part
	f.mu.Lock()
	for name, p := range f.parts {
		if !slices.Contains(want, name) {
			gone = append(gone, p)
			delete(f.parts, name)
			delete(f.items, name)
		}
	}
	var added []string
	for _, name := range want {
		if _, ok := f.parts[name]; !ok {
			added = append(added, name)
			f.items[name] = nil
		}
	}
	f.known = true
	f.swapLocked()
	f.mu.Unlock()
	_ = stopParts(gone) // slow ones end in the background; their stores are closed
	for _, name := range added {
		p := f.startPart(name)
		f.mu.Lock()
		f.parts[name] = p
		f.mu.Unlock()
	}
	f.mu.Lock()
	changed := !f.hasScope || !sameScope(f.current, sc)
	f.current, f.hasScope = sc, true
	f.mu.Unlock()
	if changed && f.s.ev.Scope != nil {
		f.s.ev.Scope(f.s.cluster, sc)
	}
}

func sameScope(a, b Scope) bool {
	return a.ClusterWide == b.ClusterWide && a.Why == b.Why && slices.Equal(a.Namespaces, b.Namespaces) && slices.Equal(a.Ignored, b.Ignored)
}
