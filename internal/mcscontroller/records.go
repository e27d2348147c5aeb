package mcscontroller

import (
	"sync"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// records is what the controller reads of the record store that the
// sources feed (a *store.Store): its change feed, which starts with every
// record held.
type records interface {
	Subscribe(func([]store.Change))
}

// recordIndex is the records by the services they export, kept from the
// store's change feed, and the services whose records changed since a
// reconcile last took them: a reconcile reads the records of the services
// it syncs, not every record (a hub holds a thousand origins' records, and
// one change is one service's).
type recordIndex struct {
	mu      sync.Mutex
	byKey   map[clusterset.Key]map[*store.Pod]struct{}
	changed map[clusterset.Key]bool
}

// indexRecords subscribes an index to rs, calling f after each change
// (quick: the store calls it before its next write).
func indexRecords(rs records, f func()) *recordIndex {
	ix := &recordIndex{byKey: map[clusterset.Key]map[*store.Pod]struct{}{}, changed: map[clusterset.Key]bool{}}
	rs.Subscribe(func(changes []store.Change) {
		ix.apply(changes)
		f()
	})
	return ix
}

func (ix *recordIndex) apply(changes []store.Change) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, ch := range changes {
		if ch.Old != nil {
			for _, e := range ch.Old.Exports {
				k := clusterset.Key{Namespace: e.Namespace, Name: e.Name}
				if g := ix.byKey[k]; g != nil {
					delete(g, ch.Old)
					if len(g) == 0 {
						delete(ix.byKey, k)
					}
				}
				ix.changed[k] = true
			}
		}
		if ch.New != nil {
			for _, e := range ch.New.Exports {
				k := clusterset.Key{Namespace: e.Namespace, Name: e.Name}
				g := ix.byKey[k]
				if g == nil {
					g = map[*store.Pod]struct{}{}
					ix.byKey[k] = g
				}
				g[ch.New] = struct{}{}
				ix.changed[k] = true
			}
		}
	}
}

// takeChanged returns the services whose records changed since the last
// call.
func (ix *recordIndex) takeChanged() map[clusterset.Key]bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := ix.changed
	ix.changed = map[clusterset.Key]bool{}
	return out
}

// groups returns the records of current clusters of the services in keys,
// or of every service when keys is nil; a service none of whose records is
// a current cluster's is left out.
func (ix *recordIndex) groups(keys map[clusterset.Key]bool, current func(string) bool) map[clusterset.Key][]*store.Pod {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := map[clusterset.Key][]*store.Pod{}
	add := func(k clusterset.Key, g map[*store.Pod]struct{}) {
		for p := range g {
			if current(p.Cluster) {
				out[k] = append(out[k], p)
			}
		}
	}
	if keys == nil {
		for k, g := range ix.byKey {
			add(k, g)
		}
		return out
	}
	for k := range keys {
		add(k, ix.byKey[k])
	}
	return out
}

// keysIn adds to keys every service of namespace ns that has records.
func (ix *recordIndex) keysIn(ns string, keys map[clusterset.Key]bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for k := range ix.byKey {
		if k.Namespace == ns {
			keys[k] = true
		}
	}
}
