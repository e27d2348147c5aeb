// Package table is the DNS answer index of the records a store.Store holds:
// it follows the store's change feed, keeps each service's exporting records
// (links to the store's, never copies), and serves an immutable Index of
// precomputed DNS answers that readers load with one atomic read. The DNS
// rules live here: which endpoints answer (locality, the stale policy,
// health), the names that cannot be encoded, the reply sizes and the
// per-namespace record cap.
//
// The feed only records what changed and marks the affected services dirty.
// A single builder goroutine turns the dirty set into a new Index: it
// rebuilds only the dirty services, copies the service map by pointer, and
// swaps the Index in. Bursts coalesce into one rebuild, and readers never
// wait on writers (the hosts plugin's swap pattern).
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
	"github.com/mcsannotations/mcsannotations/internal/store"
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

// svcList is a service's exporting Pods (the store's records), in no order.
// An index built from the table holds the same array (up to its length
// then), and marks it shared: the table only appends to a shared list (past
// the index's length, so unseen by it) and copies the list before its first
// change in place.
type svcList struct {
	pods   []*store.Pod
	shared bool
}

// Table is safe for concurrent use.
type Table struct {
	cfg Config

	mu    sync.Mutex
	bySvc map[svcKey]svcList // each service's exporting Pods: all the table holds of the records
	dirty map[svcKey]struct{}
	gen   uint64 // bumped by every write, under mu

	// Health (health.go): the endpoints a prober found down, by service,
	// and the list of asked services indexes record (nil: not tracked).
	down   map[svcKey]map[store.Key]struct{}
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
	onName   func(*store.Pod, annotation.Export)
	named    []unencodable // found by checkNames under mu, reported once it is released
	onCapped func(namespace string, records, capped int)
	capped   map[string]int // by namespace: records left out by the cap (the builder's)
}

// New returns a table over the records of st, serving an empty index until
// its first rebuild. It subscribes to st's change feed at once (taking the
// records st holds already).
func New(cfg Config, st *store.Store) *Table {
	t := &Table{
		cfg:   cfg,
		bySvc: make(map[svcKey]svcList),
		dirty: make(map[svcKey]struct{}),
		kick:  make(chan struct{}, 1),
	}
	t.cur.Store(newIndex(cfg, nil, nil, 0))
	st.Subscribe(t.apply)
	return t
}

// Config returns the table's configuration.
func (t *Table) Config() Config { return t.cfg }

// Index returns the current answer index. It never blocks.
func (t *Table) Index() *Index { return t.cur.Load() }

// OnChange registers f to be called (from the builder) after each new index
// is swapped in. Set it before Run.
func (t *Table) OnChange(f func(*Index)) { t.onChange = f }

// OnUnencodable registers f to be called once for each new or changed record
// whose endpoint name under the service of export e cannot be encoded in DNS
// (EndpointNameFits): that endpoint is left out of SRV answers and has no
// endpoint name; its addresses still answer the service name. It is called
// from the store's feed, after the table's lock is released (it logs: a slow
// log must not hold up the table's readers and its builder). Set it before
// the store's first write.
func (t *Table) OnUnencodable(f func(p *store.Pod, e annotation.Export)) { t.onName = f }

// unencodable is an export of a record whose endpoint name cannot be encoded.
type unencodable struct {
	p *store.Pod
	e annotation.Export
}

// OnCapped registers f to be called (from the builder) when the records the
// cap leaves out of a namespace's answers change: records is what its
// services would hold, capped how many of them are left out (0: within the
// cap again). Set it before Run.
func (t *Table) OnCapped(f func(namespace string, records, capped int)) { t.onCapped = f }

// checkNames collects p's exports whose endpoint name cannot be encoded, for
// unlock to report; t.mu is held.
func (t *Table) checkNames(p *store.Pod) {
	if t.onName == nil {
		return
	}
	var buf [64]byte
	host := p.Hostname
	if host == "" && len(p.IPs) > 0 {
		b := store.AppendDashedIP(buf[:0], p.IPs[0])
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

// apply is the table's subscription to its store: it takes each changed
// record out of its services' lists and puts the new one in, and marks those
// services dirty. It runs under the store's write lock (store.Subscribe), and
// reports unencodable names once its own lock is released.
func (t *Table) apply(changes []store.Change) {
	t.mu.Lock()
	for _, c := range changes {
		if c.Old != nil {
			t.unlinkLocked(c.Old)
		}
	}
	if len(changes) == 1 {
		if p := changes[0].New; p != nil {
			t.linkLocked(p)
		}
	} else {
		t.linkAllLocked(changes)
	}
	t.gen++
	t.unlock()
	t.signal()
}

// linkLocked adds the (new or changed) record p to its services' lists.
func (t *Table) linkLocked(p *store.Pod) {
	t.checkNames(p)
	for _, e := range p.Exports {
		sk := svcKey{e.Namespace, e.Name}
		l := t.bySvc[sk]
		l.pods = append(l.pods, p)
		t.bySvc[sk] = l
		t.dirty[sk] = struct{}{}
	}
}

// linkAllLocked links the new records of many changes at once. The records
// of one service share a Common (sources and the snapshot's decoder hand them
// out that way), so they are grouped by it and each group joins its
// services' lists in one append, rather than hashing two strings three times
// a record and growing every list from one element by doubling. Records with
// equal but separate Commons only make smaller groups.
func (t *Table) linkAllLocked(changes []store.Change) {
	ps := make([]*store.Pod, 0, len(changes))
	for _, c := range changes {
		if c.New != nil {
			ps = append(ps, c.New)
		}
	}
	if len(ps) == 0 {
		return
	}
	// Group by Common: number the Commons, count each one's records, and
	// lay the records out in one array, a run per Common.
	group := make(map[*store.Common]int32, len(ps)/8) // a guess: services have a few endpoints
	of := make([]int32, len(ps))                      // each record's group
	var start []int                                   // each group's count, then where its run starts
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
	runs := make([]*store.Pod, len(ps))
	for i, p := range ps {
		runs[end[of[i]]] = p
		end[of[i]]++
	}
	for g, lo := range start {
		run := runs[lo:end[g]]
		for _, p := range run {
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

// unlinkLocked removes the record old from its services' lists (a swap with
// the last element: the lists have no order).
func (t *Table) unlinkLocked(old *store.Pod) {
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
	pods     []*store.Pod
	failOpen bool
	all      []*store.Pod // every record of the service: who may resolve it does not depend on health
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
