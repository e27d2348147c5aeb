package relay

import (
	"slices"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// share points the entries of s, a slice a hub holds from now on, at the
// records the store holds already when they carry the same data: a Pod that
// two hubs (or a hub and the snapshot) hold with the same statement is then
// one *store.Pod and one *store.Common, which the store and every hub's
// slice hold alike, rather than one copy per hub. An entry whose Pod the
// store holds with other data (a newer statement), or not at all, keeps a
// record of its own, on the Common of the store's records of the slice's
// other Pods when that carries the same data.
//
// The store is the intern table: what it holds is what a reader answers
// from, every record in it is immutable, and a record lives while the store
// or some slice holds it, so there is nothing to count or free. Each record
// is compared in full (store.Pod.Equal), never by hash. Only s's entries
// change, before any of them is read under the new slice (r.mu is held).
func (r *Relay) share(s *slimSlice) {
	// The last two Commons compared, and whether they were equal: the
	// entries of a slice share one Common, and so mostly do the records
	// the store holds of them.
	var ca, cb *store.Common
	var eq bool
	equal := func(a, b *store.Common) bool {
		if a == b {
			return true
		}
		if a != ca || b != cb {
			ca, cb, eq = a, b, a.Equal(b)
		}
		return eq
	}
	var to []commonPair // each Common of s's own that the store holds an equal of
	var own []int       // the entries left with a record of their own
	for i := range s.entries {
		e := &s.entries[i]
		h := r.records.Get(e.rec.Key())
		if h == e.rec {
			continue
		}
		if h == nil || !equal(h.Common, e.rec.Common) {
			own = append(own, i)
			continue
		}
		if e.rec.Common != h.Common && heldOf(to, e.rec.Common) == nil {
			to = append(to, commonPair{e.rec.Common, h.Common})
		}
		if samePod(h, e.rec) {
			e.rec = h
		} else {
			own = append(own, i)
		}
	}
	for _, i := range own {
		e := &s.entries[i]
		if c := heldOf(to, e.rec.Common); c != nil {
			p := *e.rec // e.rec may be held by another slice: a copy on the store's Common
			p.Common = c
			e.rec = &p
		}
	}
}

// commonPair is a Common of a slice's own and the store's equal one.
type commonPair struct{ own, held *store.Common }

func heldOf(pairs []commonPair, c *store.Common) *store.Common {
	for _, p := range pairs {
		if p.own == c {
			return p.held
		}
	}
	return nil
}

// samePod reports whether two records carry the same data besides their
// Common.
func samePod(a, b *store.Pod) bool {
	return a.Name == b.Name && a.Hostname == b.Hostname && a.Ready == b.Ready && slices.Equal(a.IPs, b.IPs)
}

// shareEntries makes s hold the entries of twin, another hub's slice of the
// same key, when they are the same (the same records, after share, with the
// same Seqs and hashes): hubs name the slices of an origin alike
// (clusterset's slice names), and a second hub then holds no entries of its
// own. The entries are shared read-only but for share's swaps, under r.mu,
// each to an equal record.
func shareEntries(s, twin *slimSlice) {
	if twin == nil || twin.origin != s.origin || len(twin.entries) != len(s.entries) || len(s.entries) == 0 || &twin.entries[0] == &s.entries[0] {
		return
	}
	for i, e := range s.entries {
		if twin.entries[i] != e {
			return
		}
	}
	s.entries = twin.entries
}

// twin returns another hub's slice of s's key, if any; r.mu is held. It
// looks through the slices of s's origin, as syncOrigin does at each change.
func (r *Relay) twin(h *hub, s *slimSlice) *slimSlice {
	for _, g := range r.hubs {
		if g == h {
			continue
		}
		for _, t := range g.byOrigin[s.origin] {
			if t.Name == s.Name && t.Namespace == s.Namespace {
				return t
			}
		}
	}
	return nil
}

// twins indexes the other hubs' slices in namespace ("": every namespace)
// by key, for a complete list of h's there (nil when there are none); r.mu
// is held. It costs a pass over the hubs' slices, as slicesReplaced's own.
func (r *Relay) twins(h *hub, namespace string) map[string]*slimSlice {
	var idx map[string]*slimSlice
	for _, g := range r.hubs {
		if g == h {
			continue
		}
		for _, ss := range g.byOrigin {
			for _, t := range ss {
				if namespace != "" && t.Namespace != namespace {
					continue
				}
				if idx == nil {
					idx = map[string]*slimSlice{}
				}
				idx[t.Key()] = t
			}
		}
	}
	return idx
}
