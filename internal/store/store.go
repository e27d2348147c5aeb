// Package store keeps the records of the exporting Pods of every cluster:
// what the sources write (one cluster each), and what the DNS index
// (internal/table), the snapshot's journal and the MCS controller read. It
// knows nothing of DNS: it holds records, replaces one cluster's records in
// one step, and tells its subscribers what changed.
//
// Readers that keep a view of their own (the DNS index) or a copy on disk
// (the snapshot) follow the change feed (Subscribe) rather than copying the
// records: the store holds each record once.
package store

import "sync"

// Change is one record's change: Old is nil for a new record, New is nil for
// a deleted one. Both are set for a record replaced by a different one (an
// unchanged record is no change).
type Change struct{ Old, New *Pod }

// Key returns the key of the changed record.
func (c Change) Key() Key {
	if c.New != nil {
		return c.New.Key()
	}
	return c.Old.Key()
}

// nsKey groups records by cluster and namespace: the records are kept in one
// podSet per group, keyed by Pod name: smaller per record than one map keyed
// by Key or a map[string]*Pod per group (BenchmarkIndexHeap, in
// internal/snapshot).
type nsKey struct{ Cluster, Namespace string }

// Store is safe for concurrent use.
//
// Two locks: write serialises the writes and their delivery to subscribers,
// mu guards the records. A writer changes the records under both, releases
// mu, and calls the subscribers under write alone: readers (Pods, Len, from a
// subscriber too) never wait on a subscriber, and subscribers see the writes
// one at a time, in order.
type Store struct {
	write sync.Mutex
	subs  []func([]Change) // under write
	one   [1]Change        // the batch of a single change; under write

	mu   sync.Mutex
	pods map[nsKey]*podSet // by cluster and namespace, then name
	// nss are the namespaces of each cluster's groups in pods, so that a
	// write or read of one cluster does not walk every cluster's groups
	// (a reader of hubs replaces one origin among a thousand at a time).
	nss map[string][]string
}

// New returns an empty store.
func New() *Store { return &Store{pods: make(map[nsKey]*podSet), nss: make(map[string][]string)} }

// addNS notes a new group of cluster in namespace ns; s.mu is held.
func (s *Store) addNS(cluster, ns string) {
	s.nss[cluster] = append(s.nss[cluster], ns)
}

// removeNS forgets the group of cluster in namespace ns; s.mu is held.
func (s *Store) removeNS(cluster, ns string) {
	l := s.nss[cluster]
	for i, n := range l {
		if n == ns {
			l[i] = l[len(l)-1]
			l = l[:len(l)-1]
			break
		}
	}
	if len(l) == 0 {
		delete(s.nss, cluster)
		return
	}
	s.nss[cluster] = l
}

// Subscribe registers f, the change feed: after each write that changed
// records, f is called once with that write's changes (a ReplaceCluster's
// all together), deletions first. f is called first, at once, with the
// records already held as new ones, if any, so that a late subscriber misses
// nothing.
//
// f is called by the writer, with the records' lock released (f may call
// Pods and Len) but before the next write starts: subscribers see the writes
// one at a time, in the order they were made, each subscriber in the order
// they subscribed. So f must be quick, must not write to the store (that
// would wait forever), and must not keep the slice, which the store reuses
// (the records in it are immutable and may be kept).
func (s *Store) Subscribe(f func([]Change)) {
	s.write.Lock()
	defer s.write.Unlock()
	s.subs = append(s.subs, f)
	var held []Change
	s.mu.Lock()
	for _, g := range s.pods {
		for p := range g.all {
			held = append(held, Change{New: p})
		}
	}
	s.mu.Unlock()
	if len(held) > 0 {
		f(held)
	}
}

// notify hands a write's changes to every subscriber; s.write is held.
func (s *Store) notify(changes []Change) {
	if len(changes) == 0 {
		return
	}
	for _, f := range s.subs {
		f(changes)
	}
}

// notifyOne hands a write's single change to every subscriber; s.write is
// held.
func (s *Store) notifyOne(c Change) {
	s.one[0] = c
	s.notify(s.one[:])
	s.one[0] = Change{} // holds no record once it is gone
}

// Upsert adds or replaces a Pod record. A record equal to the one held
// changes nothing (the one held stays).
func (s *Store) Upsert(p *Pod) {
	s.write.Lock()
	defer s.write.Unlock()
	s.mu.Lock()
	nk := nsKey{p.Cluster, p.Namespace}
	g := s.pods[nk]
	if g == nil {
		g = newPodSet(1)
		s.pods[nk] = g
		s.addNS(nk.Cluster, nk.Namespace)
	}
	old := g.get(p.Name)
	if old.Equal(p) {
		s.mu.Unlock()
		return
	}
	g.put(p)
	s.mu.Unlock()
	s.notifyOne(Change{Old: old, New: p})
}

// Delete removes a Pod record; deleting an unknown key is a no-op.
func (s *Store) Delete(k Key) {
	s.write.Lock()
	defer s.write.Unlock()
	s.mu.Lock()
	nk := nsKey{k.Cluster, k.Namespace}
	var old *Pod
	if g := s.pods[nk]; g != nil {
		old = g.remove(k.Name)
		if g.len() == 0 {
			delete(s.pods, nk)
			s.removeNS(nk.Cluster, nk.Namespace)
		}
	}
	s.mu.Unlock()
	if old != nil {
		s.notifyOne(Change{Old: old})
	}
}

// ReplaceCluster makes pods the complete set of records of cluster: records
// of that cluster not in pods are deleted, the others upserted, all in one
// step (one batch of the feed), so no reader ever sees the cluster's
// surviving records missing. An unchanged record keeps the one held. Records
// of another cluster in pods are ignored; of two with one key, the later
// wins.
func (s *Store) ReplaceCluster(cluster string, pods []*Pod) {
	// The new groups are built first, sized from a count, outside the locks.
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
			groups[nsKey{p.Cluster, p.Namespace}].put(p)
		}
	}

	s.write.Lock()
	defer s.write.Unlock()
	s.mu.Lock()
	var changes []Change
	// Deleted: the cluster's records that the new groups lack.
	for _, ns := range s.nss[cluster] {
		nk := nsKey{cluster, ns}
		old := s.pods[nk]
		g := groups[nk]
		for op := range old.all {
			if g.get(op.Name) == nil {
				changes = append(changes, Change{Old: op})
			}
		}
		if g == nil {
			delete(s.pods, nk)
		}
	}
	// Upserted: each group replaces the old one; an unchanged record keeps
	// its old pointer.
	if n := len(changes) + len(pods); cap(changes) < n {
		changes = append(make([]Change, 0, n), changes...)
	}
	nss := make([]string, 0, len(groups))
	for nk, g := range groups {
		old := s.pods[nk]
		for p := range g.all {
			op := old.get(p.Name)
			if op.Equal(p) {
				g.put(op)
				continue
			}
			changes = append(changes, Change{Old: op, New: p})
		}
		s.pods[nk] = g
		nss = append(nss, nk.Namespace)
	}
	if len(nss) == 0 {
		delete(s.nss, cluster)
	} else {
		s.nss[cluster] = nss
	}
	s.mu.Unlock()
	s.notify(changes)
}

// Pods returns the records of cluster (all clusters when cluster is ""), in
// no order. The records are immutable; the slice is the caller's.
func (s *Store) Pods(cluster string) []*Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Pod
	if cluster != "" {
		for _, ns := range s.nss[cluster] {
			for p := range s.pods[nsKey{cluster, ns}].all {
				out = append(out, p)
			}
		}
		return out
	}
	for _, g := range s.pods {
		for p := range g.all {
			out = append(out, p)
		}
	}
	return out
}

// Get returns the record held under k, or nil. The record is immutable.
func (s *Store) Get(k Key) *Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods[nsKey{k.Cluster, k.Namespace}].get(k.Name)
}

// Len returns the number of records per cluster.
func (s *Store) Len() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int)
	for nk, g := range s.pods {
		out[nk.Cluster] += g.len()
	}
	return out
}
