// Package table holds the multi-cluster service table: the slim Pod records of
// every source, grouped into services, and an immutable Index of precomputed
// DNS answers that readers load with one atomic read.
//
// Writers (informer handlers, the snapshot loader) only record what changed and
// mark the affected services dirty. A single builder goroutine turns the dirty
// set into a new Index: it rebuilds only the dirty services, copies the
// service map by pointer, and swaps the Index in. Bursts coalesce into one
// rebuild, and readers never wait on writers (the hosts plugin's swap pattern).
package table

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Locality chooses which clusters' endpoints a service name answers with.
type Locality int

const (
	// PreferLocal answers with the local cluster's ready endpoints when it has
	// any, else with every other cluster's.
	PreferLocal Locality = iota
	// Any answers with every cluster's ready endpoints.
	Any
)

func (l Locality) String() string {
	if l == Any {
		return "any"
	}
	return "prefer-local"
}

// Config fixes how answers are rendered. Zone is the clusterset zone, fully
// qualified and lower case ("clusterset.local.").
type Config struct {
	Zone         string
	TTL          uint32
	LocalCluster string
	Locality     Locality
}

type svcKey struct{ Namespace, Name string }

// nsKey groups records by cluster and namespace: the records are kept in one
// map per group, keyed by Pod name, whose keys share the records' own name
// strings. A single map keyed by Key (three strings, 48 bytes) took about
// 30 bytes more per record (BenchmarkIndexHeap).
type nsKey struct{ Cluster, Namespace string }

// Table is safe for concurrent use.
type Table struct {
	cfg Config

	mu    sync.Mutex
	pods  map[nsKey]map[string]*Pod // by cluster and namespace, then name
	bySvc map[svcKey][]*Pod         // each service's exporting Pods, in no order
	dirty map[svcKey]struct{}
	gen   uint64 // bumped by every write, under mu

	kick     chan struct{}
	built    atomic.Uint64 // the gen the current index reflects
	buildMu  sync.Mutex    // one builder at a time
	cur      atomic.Pointer[Index]
	onChange func(*Index)
	onPod    func(Key, *Pod)
}

// New returns an empty table serving an empty index.
func New(cfg Config) *Table {
	t := &Table{
		cfg:   cfg,
		pods:  make(map[nsKey]map[string]*Pod),
		bySvc: make(map[svcKey][]*Pod),
		dirty: make(map[svcKey]struct{}),
		kick:  make(chan struct{}, 1),
	}
	t.cur.Store(newIndex(cfg, nil, 0))
	return t
}

// Config returns the table's configuration.
func (t *Table) Config() Config { return t.cfg }

// Index returns the current answer index. It never blocks.
func (t *Table) Index() *Index { return t.cur.Load() }

// OnChange registers f to be called (from the builder) after each new index
// is swapped in. Set it before Run.
func (t *Table) OnChange(f func(*Index)) { t.onChange = f }

// OnPodChange registers f to be called for every record that changes, with
// the new record (nil when deleted): the snapshot's journal. It is called with
// the table's write lock held, so it must be quick and must not call back
// into the table. Set it before any write.
func (t *Table) OnPodChange(f func(Key, *Pod)) { t.onPod = f }

// Upsert adds or replaces a Pod record.
func (t *Table) Upsert(p *Pod) {
	t.mu.Lock()
	t.upsertLocked(p)
	t.gen++
	t.mu.Unlock()
	t.signal()
}

// Delete removes a Pod record; deleting an unknown key is a no-op.
func (t *Table) Delete(k Key) {
	t.mu.Lock()
	if t.deleteLocked(k) {
		t.gen++
	}
	t.mu.Unlock()
	t.signal()
}

// ReplaceCluster makes pods the complete set of records of cluster: records
// of that cluster not in pods are deleted, the others upserted, all in one
// step, so no index ever shows the cluster's surviving endpoints missing.
// Records of another cluster in pods are ignored.
func (t *Table) ReplaceCluster(cluster string, pods []*Pod) {
	// The new groups are built first, sized from a count, outside the lock.
	counts := make(map[nsKey]int)
	for _, p := range pods {
		if p.Cluster == cluster {
			counts[nsKey{p.Cluster, p.Namespace}]++
		}
	}
	groups := make(map[nsKey]map[string]*Pod, len(counts))
	for nk, n := range counts {
		groups[nk] = make(map[string]*Pod, n)
	}
	for _, p := range pods {
		if p.Cluster == cluster {
			groups[nsKey{p.Cluster, p.Namespace}][p.Name] = p // a later duplicate wins, as with Upsert
		}
	}

	t.mu.Lock()
	// Deleted: the cluster's records that the new groups lack.
	for nk, old := range t.pods {
		if nk.Cluster != cluster {
			continue
		}
		g := groups[nk]
		for name, op := range old {
			if _, ok := g[name]; !ok {
				t.unlinkLocked(op)
				if t.onPod != nil {
					t.onPod(op.Key(), nil)
				}
			}
		}
		if g == nil {
			delete(t.pods, nk)
		}
	}
	// Upserted: each group replaces the old one; an unchanged record keeps
	// its old pointer (the services' lists hold it) and marks nothing.
	for nk, g := range groups {
		old := t.pods[nk]
		for name, p := range g {
			if op, ok := old[name]; ok {
				if op.Equal(p) {
					g[name] = op
					continue
				}
				t.unlinkLocked(op)
			}
			t.linkLocked(p)
		}
		t.pods[nk] = g
	}
	t.gen++
	t.mu.Unlock()
	t.signal()
}

// Pods returns the records of cluster (all clusters when cluster is "").
func (t *Table) Pods(cluster string) []*Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*Pod
	for nk, g := range t.pods {
		if cluster == "" || nk.Cluster == cluster {
			for _, p := range g {
				out = append(out, p)
			}
		}
	}
	return out
}

// Len returns the number of Pod records per cluster.
func (t *Table) Len() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int)
	for nk, g := range t.pods {
		out[nk.Cluster] += len(g)
	}
	return out
}

func (t *Table) upsertLocked(p *Pod) {
	nk := nsKey{p.Cluster, p.Namespace}
	g := t.pods[nk]
	if old, ok := g[p.Name]; ok {
		if old.Equal(p) {
			return // nothing to rebuild or persist
		}
		t.unlinkLocked(old)
	}
	if g == nil {
		g = make(map[string]*Pod)
		t.pods[nk] = g
	}
	g[p.Name] = p
	t.linkLocked(p)
}

// linkLocked adds the (new or changed) record p to its services' lists and
// reports it to the journal; the caller has put it in its group.
func (t *Table) linkLocked(p *Pod) {
	if t.onPod != nil {
		t.onPod(p.Key(), p)
	}
	for _, e := range p.Exports {
		sk := svcKey{e.Namespace, e.Name}
		t.bySvc[sk] = append(t.bySvc[sk], p)
		t.dirty[sk] = struct{}{}
	}
}

func (t *Table) deleteLocked(k Key) bool {
	nk := nsKey{k.Cluster, k.Namespace}
	g := t.pods[nk]
	old, ok := g[k.Name]
	if !ok {
		return false
	}
	t.unlinkLocked(old)
	delete(g, k.Name)
	if len(g) == 0 {
		delete(t.pods, nk)
	}
	if t.onPod != nil {
		t.onPod(k, nil)
	}
	return true
}

// unlinkLocked removes the record old from its services' lists (a swap with
// the last element: the lists have no order).
func (t *Table) unlinkLocked(old *Pod) {
	for _, e := range old.Exports {
		sk := svcKey{e.Namespace, e.Name}
		ps := t.bySvc[sk]
		for i, p := range ps {
			if p == old {
				last := len(ps) - 1
				ps[i] = ps[last]
				ps[last] = nil
				ps = ps[:last]
				break
			}
		}
		if len(ps) == 0 {
			delete(t.bySvc, sk)
		} else {
			t.bySvc[sk] = ps
		}
		t.dirty[sk] = struct{}{}
	}
}

func (t *Table) signal() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// Run rebuilds the index whenever records change, until ctx is done.
func (t *Table) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
			t.Rebuild()
		}
	}
}

// Rebuild brings the index up to date with every write made before the call
// and returns it. Run calls it; tests and start-up call it directly.
func (t *Table) Rebuild() *Index {
	t.buildMu.Lock()
	defer t.buildMu.Unlock()

	t.mu.Lock()
	gen := t.gen
	if gen == t.built.Load() && len(t.dirty) == 0 {
		t.mu.Unlock()
		return t.cur.Load()
	}
	dirty := t.dirty
	t.dirty = make(map[svcKey]struct{})
	// Gather the dirty services' Pods under the lock; answers are rendered
	// later, on first use (see entry).
	members := make(map[svcKey][]*Pod, len(dirty))
	for sk := range dirty {
		// A copy: the table's lists change in place, an index never does.
		members[sk] = slices.Clone(t.bySvc[sk])
	}
	t.mu.Unlock()

	old := t.cur.Load()
	services := make(map[string]*entry, len(old.services)+len(members))
	for k, e := range old.services {
		services[k] = e
	}
	for sk, ps := range members {
		name := sk.Name + "." + sk.Namespace
		if serves(sk, ps) {
			services[name] = &entry{cfg: &t.cfg, sk: sk, pods: ps}
		} else {
			delete(services, name)
		}
	}
	idx := newIndex(t.cfg, services, uint32(time.Now().Unix()))
	t.cur.Store(idx)
	t.built.Store(gen)
	if t.onChange != nil {
		t.onChange(idx)
	}
	return idx
}
