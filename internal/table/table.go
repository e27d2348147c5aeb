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
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/mcsannotations/mcsannotations/annotation"
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
//
// NamespaceRecords caps the records the answers of one namespace's services
// may hold (0: no cap): a tenant with many Pods backing many services with
// many named ports cannot make the index grow past it. Over the cap, each
// service of the namespace gets an equal share, and services that need less
// leave theirs to the others (Table.capNamespaces).
type Config struct {
	Zone             string
	TTL              uint32
	LocalCluster     string
	Locality         Locality
	NamespaceRecords int
}

type svcKey struct{ Namespace, Name string }

// svcList is a service's exporting Pods, in no order. An index built from the
// table holds the same array (up to its length then), and marks it shared: the
// table only appends to a shared list (past the index's length, so unseen by
// it) and copies the list before its first change in place.
type svcList struct {
	pods   []*Pod
	shared bool
}

// nsKey groups records by cluster and namespace: the records are kept in one
// podSet per group, keyed by Pod name: smaller per record than one map keyed
// by Key or a map[string]*Pod per group (BenchmarkIndexHeap, in
// internal/snapshot).
type nsKey struct{ Cluster, Namespace string }

// Table is safe for concurrent use.
type Table struct {
	cfg Config

	mu    sync.Mutex
	pods  map[nsKey]*podSet  // by cluster and namespace, then name
	bySvc map[svcKey]svcList // each service's exporting Pods
	dirty map[svcKey]struct{}
	gen   uint64 // bumped by every write, under mu

	// Health (health.go): the endpoints a prober found down, by service,
	// and the list of asked services indexes record (nil: not tracked).
	down   map[svcKey]map[Key]struct{}
	demand *demand
	// staleFor: how long each cluster out of contact has been
	// (stalepolicy.go); clusters in contact are absent.
	staleFor map[string]time.Duration
	graces   graces // of the entries that drop stale endpoints

	// The ClusterSetIP services (SetClusterSetIPs): as set, and rendered,
	// keyed as the index's services are. Replaced whole, never changed.
	importList  []ClusterSetIP
	imports     map[string]*Service
	importState ImportState

	kick     chan struct{}
	built    atomic.Uint64 // the gen the current index reflects
	buildMu  sync.Mutex    // one builder at a time
	cur      atomic.Pointer[Index]
	onChange func(*Index)
	onPod    func(Key, *Pod)
	onName   func(*Pod, annotation.Export)
	named    []unencodable // found by checkNames under mu, reported once it is released
	onCapped func(namespace string, records, capped int)
	capped   map[string]int // by namespace: records left out by the cap (the builder's)
}

// New returns an empty table serving an empty index.
func New(cfg Config) *Table {
	t := &Table{
		cfg:   cfg,
		pods:  make(map[nsKey]*podSet),
		bySvc: make(map[svcKey]svcList),
		dirty: make(map[svcKey]struct{}),
		kick:  make(chan struct{}, 1),
	}
	t.cur.Store(newIndex(cfg, nil, nil, 0))
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

// OnUnencodable registers f to be called once for each new or changed record
// whose endpoint name under the service of export e cannot be encoded in DNS
// (EndpointNameFits): that endpoint is left out of SRV answers and has no
// endpoint name; its addresses still answer the service name. It is called
// by the writer after the table's lock is released (it logs: a slow log
// must not hold up the table's readers and writers). Set it before any write.
func (t *Table) OnUnencodable(f func(p *Pod, e annotation.Export)) { t.onName = f }

// unencodable is an export of a record whose endpoint name cannot be encoded.
type unencodable struct {
	p *Pod
	e annotation.Export
}

// OnCapped registers f to be called (from the builder) when the records the
// cap leaves out of a namespace's answers change: records is what its
// services would hold, capped how many of them are left out (0: within the
// cap again). Set it before Run.
func (t *Table) OnCapped(f func(namespace string, records, capped int)) { t.onCapped = f }

// checkNames collects p's exports whose endpoint name cannot be encoded, for
// unlock to report; t.mu is held.
func (t *Table) checkNames(p *Pod) {
	if t.onName == nil {
		return
	}
	var buf [64]byte
	host := p.Hostname
	if host == "" && len(p.IPs) > 0 {
		b := dashedInto(buf[:0], p.IPs[0])
		host = unsafe.String(unsafe.SliceData(b), len(b)) // read below only, while buf lives
	}
	if host == "" {
		return // no address and no hostname (a Pod not yet scheduled): no endpoint name, nothing answered
	}
	for _, e := range p.Exports {
		if !EndpointNameFits(host, p.Cluster, e.Name, e.Namespace, t.cfg.Zone) {
			t.named = append(t.named, unencodable{p, e})
		}
	}
}

// unlock releases t.mu after a write, then reports what checkNames found.
func (t *Table) unlock() {
	named := t.named
	t.named = nil
	t.mu.Unlock()
	for _, u := range named {
		t.onName(u.p, u.e)
	}
}

// Upsert adds or replaces a Pod record.
func (t *Table) Upsert(p *Pod) {
	t.mu.Lock()
	t.upsertLocked(p)
	t.gen++
	t.unlock()
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
	groups := make(map[nsKey]*podSet, len(counts))
	for nk, n := range counts {
		groups[nk] = newPodSet(n)
	}
	for _, p := range pods {
		if p.Cluster == cluster {
			groups[nsKey{p.Cluster, p.Namespace}].put(p) // a later duplicate wins, as with Upsert
		}
	}

	t.mu.Lock()
	// Deleted: the cluster's records that the new groups lack.
	for nk, old := range t.pods {
		if nk.Cluster != cluster {
			continue
		}
		g := groups[nk]
		for op := range old.all {
			if g.get(op.Name) == nil {
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
	fresh := make([]*Pod, 0, len(pods))
	for nk, g := range groups {
		old := t.pods[nk]
		for p := range g.all {
			if op := old.get(p.Name); op != nil {
				if op.Equal(p) {
					g.put(op)
					continue
				}
				t.unlinkLocked(op)
			}
			fresh = append(fresh, p)
		}
		t.pods[nk] = g
	}
	t.linkAllLocked(fresh)
	t.gen++
	t.unlock()
	t.signal()
}

// Pods returns the records of cluster (all clusters when cluster is "").
func (t *Table) Pods(cluster string) []*Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*Pod
	for nk, g := range t.pods {
		if cluster == "" || nk.Cluster == cluster {
			for p := range g.all {
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
		out[nk.Cluster] += g.len()
	}
	return out
}

func (t *Table) upsertLocked(p *Pod) {
	nk := nsKey{p.Cluster, p.Namespace}
	g := t.pods[nk]
	if g == nil {
		g = newPodSet(1)
		t.pods[nk] = g
	}
	if old := g.get(p.Name); old != nil {
		if old.Equal(p) {
			return // nothing to rebuild or persist
		}
		t.unlinkLocked(old)
	}
	g.put(p)
	t.linkLocked(p)
}

// linkLocked adds the (new or changed) record p to its services' lists and
// reports it to the journal; the caller has put it in its group.
func (t *Table) linkLocked(p *Pod) {
	if t.onPod != nil {
		t.onPod(p.Key(), p)
	}
	t.checkNames(p)
	for _, e := range p.Exports {
		sk := svcKey{e.Namespace, e.Name}
		l := t.bySvc[sk]
		l.pods = append(l.pods, p)
		t.bySvc[sk] = l
		t.dirty[sk] = struct{}{}
	}
}

// linkAllLocked links many records at once. The records of one service
// share a Common (sources and the snapshot's decoder hand them out that way),
// so they are grouped by it and each group joins its services' lists in one
// append, rather than hashing two strings three times a record and growing
// every list from one element by doubling. Records with equal but separate
// Commons only make smaller groups.
func (t *Table) linkAllLocked(ps []*Pod) {
	if len(ps) == 0 {
		return
	}
	// Group by Common: number the Commons, count each one's records, and
	// lay the records out in one array, a run per Common.
	group := make(map[*Common]int32, len(ps)/8) // a guess: services have a few endpoints
	of := make([]int32, len(ps))                // each record's group
	var start []int                             // each group's count, then where its run starts
	for i, p := range ps {
		g, ok := group[p.Common]
		if !ok {
			g = int32(len(start))
			group[p.Common] = g
			start = append(start, 0)
		}
		of[i] = g
		start[g]++
	}
	n := 0
	for g, count := range start {
		start[g] = n
		n += count
	}
	// An empty table (the snapshot's load, a first list) gets its maps at
	// about their size (a group is a service's records), rather than
	// growing them a step at a time.
	if len(t.bySvc) == 0 {
		t.bySvc = make(map[svcKey]svcList, len(start))
	}
	if len(t.dirty) == 0 {
		t.dirty = make(map[svcKey]struct{}, len(start))
	}
	end := slices.Clone(start) // where each run ends, once filled
	runs := make([]*Pod, len(ps))
	for i, p := range ps {
		runs[end[of[i]]] = p
		end[of[i]]++
	}
	for g, lo := range start {
		run := runs[lo:end[g]]
		for _, p := range run {
			if t.onPod != nil {
				t.onPod(p.Key(), p)
			}
			t.checkNames(p)
		}
		for _, e := range run[0].Exports {
			sk := svcKey{e.Namespace, e.Name}
			l := t.bySvc[sk]
			l.pods = append(l.pods, run...)
			t.bySvc[sk] = l
			t.dirty[sk] = struct{}{}
		}
	}
}

func (t *Table) deleteLocked(k Key) bool {
	nk := nsKey{k.Cluster, k.Namespace}
	g := t.pods[nk]
	if g == nil {
		return false
	}
	old := g.remove(k.Name)
	if old == nil {
		return false
	}
	t.unlinkLocked(old)
	if g.len() == 0 {
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
		l := t.bySvc[sk]
		if i := slices.Index(l.pods, old); i >= 0 {
			if l.shared {
				l = svcList{pods: slices.Clone(l.pods)}
			}
			last := len(l.pods) - 1
			l.pods[i] = l.pods[last]
			l.pods[last] = nil
			l.pods = l.pods[:last]
		}
		if len(l.pods) == 0 {
			delete(t.bySvc, sk)
		} else {
			t.bySvc[sk] = l
		}
		t.dirty[sk] = struct{}{}
	}
}

// healthy is a service's Pods to render (healthyLocked).
type healthy struct {
	pods     []*Pod
	failOpen bool
	all      []*Pod // every record of the service: who may resolve it does not depend on health
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
	members := make(map[svcKey]healthy, len(dirty))
	for sk := range dirty {
		// The index shares the list; the table copies it before changing it
		// in place (see svcList).
		l := t.bySvc[sk]
		if len(l.pods) > 0 {
			l.shared = true
			t.bySvc[sk] = l
		}
		pods, failOpen := t.healthyLocked(sk, l.pods)
		members[sk] = healthy{pods, failOpen, l.pods}
	}
	imports, dem, state := t.imports, t.demand, t.importState
	t.mu.Unlock()

	old := t.cur.Load()
	services := make(map[string]*entry, len(old.services)+len(members))
	for k, e := range old.services {
		services[k] = e
	}
	for sk, h := range members {
		name := sk.Name + "." + sk.Namespace
		if serves(sk, h.pods) {
			e := &entry{cfg: &t.cfg, sk: sk, pods: h.pods, access: accessOf(sk, h.all), cost: recordCost(&t.cfg, sk, h.pods)}
			var flags uint32
			if h.failOpen {
				flags |= entryFailOpen
			}
			if exportedClusterSetIP(sk, h.all) {
				flags |= entryClusterSetIP
			}
			e.flags.Store(flags)
			services[name] = e
		} else {
			delete(services, name)
		}
	}
	t.capNamespaces(services, members)
	idx := newIndex(t.cfg, services, imports, uint32(time.Now().Unix()))
	idx.demand, idx.importState = dem, state
	t.cur.Store(idx)
	t.built.Store(gen)
	if t.onChange != nil {
		t.onChange(idx)
	}
	return idx
}

// capNamespaces shares out the record cap among the services of each
// namespace that members touch (water-filling: each service gets an equal
// share, and services that need less leave the rest to the others), and
// replaces the entries whose budget changed; they render again when asked.
// It costs a pass over the services, as the index's namespace list does.
func (t *Table) capNamespaces(services map[string]*entry, members map[svcKey]healthy) {
	limit := t.cfg.NamespaceRecords
	if limit <= 0 {
		return
	}
	touched := map[string][]string{}
	for sk := range members {
		touched[sk.Namespace] = nil
	}
	for k, e := range services {
		if names, ok := touched[e.sk.Namespace]; ok {
			touched[e.sk.Namespace] = append(names, k)
		}
	}
	if t.capped == nil {
		t.capped = map[string]int{}
	}
	for ns, names := range touched {
		total := 0
		for _, k := range names {
			total += services[k].cost
		}
		budgets := make(map[string]int, len(names))
		if total > limit {
			// The smallest first: each takes what it needs while that is
			// at most an equal share of what is left.
			slices.SortFunc(names, func(a, b string) int {
				return cmp.Or(cmp.Compare(services[a].cost, services[b].cost), cmp.Compare(a, b))
			})
			left := limit
			for i, k := range names {
				share := left / (len(names) - i)
				if c := services[k].cost; c <= share {
					left -= c
					continue
				}
				budgets[k] = max(share, 1) // 1: 0 means no cap
				left -= share
			}
		}
		capped := 0
		for _, k := range names {
			e := services[k]
			b := budgets[k]
			if b > 0 {
				capped += e.cost - b
			}
			if b != e.budget {
				ne := &entry{cfg: e.cfg, sk: e.sk, pods: e.pods, access: e.access, cost: e.cost, budget: b}
				ne.flags.Store(e.flags.Load() & (entryFailOpen | entryClusterSetIP))
				services[k] = ne
			}
		}
		if capped != t.capped[ns] {
			if capped == 0 {
				delete(t.capped, ns)
			} else {
				t.capped[ns] = capped
			}
			if t.onCapped != nil {
				t.onCapped(ns, total, capped)
			}
		}
	}
}
