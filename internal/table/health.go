package table

import (
	"sync/atomic"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Health: a prober (internal/probe) learns which services are asked from the
// index, and tells the table which of their endpoints do not respond. A down
// endpoint leaves its service's answers, endpoint names included, when the
// service is next rendered; a service whose ready endpoints are all down
// answers with all of them (fail open). Answers stay precomputed: a health
// change marks the service dirty, and the builder renders it again off the
// query path.

// demand is the list of services asked since the prober last took it: a
// lock-free stack of index entries, each pushed at most once until taken, so
// that marking a service asked costs a query one atomic load (two atomic
// operations the first time), no lock and no allocation.
type demand struct {
	head atomic.Pointer[entry]
}

// mark records that e was asked. It is called on the query path.
func (d *demand) mark(e *entry) {
	if d == nil {
		return
	}
	f := e.flags.Load()
	if f&entryQueued != 0 || !e.flags.CompareAndSwap(f, f|entryQueued) {
		return
	}
	for {
		old := d.head.Load()
		e.next = old
		if d.head.CompareAndSwap(old, e) {
			return
		}
	}
}

// TrackDemand makes the table's indexes record which services are asked, for
// Asked. Call it before Run when a prober takes the list; without one, the
// list would only grow.
func (t *Table) TrackDemand() {
	t.mu.Lock()
	t.demand = &demand{}
	t.gen++ // the next index carries the list
	t.mu.Unlock()
	t.signal()
}

// Asked calls f with each service looked up (by Lookup or LookupService)
// since the last call. A service asked again during the call may be reported
// again by the next one.
func (t *Table) Asked(f func(namespace, name string)) {
	t.mu.Lock()
	d := t.demand
	t.mu.Unlock()
	if d == nil {
		return
	}
	for e := d.head.Swap(nil); e != nil; {
		next := e.next
		e.next = nil
		f(e.sk.Namespace, e.sk.Name)
		e.flags.And(^entryQueued) // after next is read: a query may push e again now
		e = next
	}
}

// Members returns the Pods that export the service namespace/name (ready or
// not), in no order. The records are immutable; the slice is the caller's.
func (t *Table) Members(namespace, name string) []*store.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.bySvc[svcKey{namespace, name}]
	return append([]*store.Pod(nil), l.pods...)
}

// SetDown marks the endpoint pod of the service namespace/name down (it
// leaves the service's answers) or up again, and queues the service's
// rendering. Marks of records that are gone are harmless; the prober clears
// the marks it no longer tracks.
func (t *Table) SetDown(namespace, name string, pod store.Key, down bool) {
	sk := svcKey{namespace, name}
	t.mu.Lock()
	set := t.down[sk]
	_, was := set[pod]
	if was == down {
		t.mu.Unlock()
		return
	}
	if down {
		if set == nil {
			if t.down == nil {
				t.down = make(map[svcKey]map[store.Key]struct{})
			}
			set = make(map[store.Key]struct{})
			t.down[sk] = set
		}
		set[pod] = struct{}{}
	} else {
		delete(set, pod)
		if len(set) == 0 {
			delete(t.down, sk)
		}
	}
	t.dirty[sk] = struct{}{}
	t.gen++
	t.mu.Unlock()
	t.signal()
}

// healthyLocked returns the Pods of sk to render: pods without those the
// stale policy drops (stalepolicy.go) and without the down ones,
// or pods itself with failOpen set when every ready endpoint is down (or
// with nothing down).
func (t *Table) healthyLocked(sk svcKey, pods []*store.Pod) (out []*store.Pod, failOpen bool) {
	pods = t.freshLocked(sk, pods) // a dropped endpoint is no endpoint, up or down
	down := t.down[sk]
	if len(down) == 0 {
		return pods, false
	}
	for _, p := range pods {
		if _, d := down[p.Key()]; !d {
			out = append(out, p)
		}
	}
	if !serves(sk, out) {
		return pods, serves(sk, pods)
	}
	return out, false
}
