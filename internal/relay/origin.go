package relay

import (
	"fmt"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// origin is what the Relay keeps of one origin cluster (under r.mu).
type origin struct {
	// seen remembers, under verify, the statement accepted last for each
	// of the origin's Pods ("namespace/name"), and for a deleted Pod until
	// TombstoneTTL: the replay rule's memory, at most ingest.MaxObjects.
	// changed names the Pods whose memory changed since it was last
	// reported (Events.Remembered; memory.go).
	seen    map[string]*seen
	changed map[string]bool
	records int       // written last
	seed    time.Time // last contact from a snapshot
	// last is the latest contact the hubs' words gave at a change, kept
	// for when no hub holds the origin any more.
	last  time.Time
	state source.State
	full  bool // a new Pod was refused for a full memory (reported once)
	// expired: Expire dropped its records; they stay out until some hub is
	// current on it again.
	expired bool
	// list is, under verify, the newest Pod list of the origin that
	// verified (podlist.go); unlisted the records it dropped at the last
	// look ("hub\x00namespace/name" → Seq), each reported once.
	list     *podList
	unlisted map[string]uint64
}

type seen struct {
	seq  uint64
	hash uint64
	gone time.Time // when the record went; zero while it is held
}

// origin returns the origin named, made if new; r.mu is held.
func (r *Relay) origin(name string) *origin {
	o := r.origins[name]
	if o == nil {
		o = &origin{seen: map[string]*seen{}}
		r.origins[name] = o
	}
	return o
}

// locked runs f under r.write and r.mu, unless the Relay stopped, then
// what f queued in out (the store's writes, in order, then the events) once
// r.mu is released, still under r.write: the writes are made in the order
// they were decided, and Origins and Hubs never wait on the store's
// subscribers or the events.
func (r *Relay) locked(f func(out *later)) {
	r.write.Lock()
	defer r.write.Unlock()
	var out later
	r.mu.Lock()
	if !r.stopped {
		f(&out)
	}
	r.mu.Unlock()
	out.run()
}

// later is what the Relay calls out once r.mu is released.
type later []func()

func (l later) run() {
	for _, f := range l {
		f()
	}
}

// report hands the refusals of a slice's transform to Events.Refused,
// those that old (what the store held under its key) did not make already:
// a bad entry is reported when it arrives, not again at each change of the
// slice's other entries.
func (r *Relay) report(hub string, old, s *slimSlice) {
	ev := r.cfg.Events.Refused
	if ev == nil || s.bad == nil || old != nil && old.annoHash == s.annoHash {
		return
	}
	var before map[refusal]bool
	if old != nil && old.Namespace == s.Namespace && old.originLabel() == s.originLabel() {
		before = make(map[refusal]bool, len(old.refusals()))
		for _, f := range old.refusals() {
			before[f] = true
		}
	}
	for _, f := range s.bad.list {
		if !before[f] {
			ev(hub, s.originLabel(), s.Namespace, f.pod, f.r)
		}
	}
}

// originLabel is the origin a slice names, for a refusal's report.
func (s *slimSlice) originLabel() string {
	if s.origin != "" || s.bad == nil {
		return s.origin
	}
	return s.bad.label
}

// sliceChanged applies a change of one of h's slices (old nil: new; s nil:
// deleted).
func (r *Relay) sliceChanged(h *hub, old, s *slimSlice) {
	r.locked(func(out *later) {
		touched := map[string]bool{}
		if old != nil && old.origin != "" {
			h.remove(old)
			touched[old.origin] = true
		}
		if s != nil && s.origin != "" {
			r.checkReplays(h, old, s, out)
			h.add(s)
			touched[s.origin] = true
		}
		if !h.listed {
			return // it contributes nothing before its first list
		}
		for o := range touched {
			r.syncOrigin(o, out)
		}
	})
}

// slicesReplaced applies a complete list of h's slices in part p's
// namespace (every namespace for "").
func (r *Relay) slicesReplaced(h *hub, p *slicePart, old, objs map[string]*slimSlice) {
	r.locked(func(out *later) {
		touched := map[string]bool{}
		for o, ss := range h.byOrigin {
			kept := ss[:0]
			for _, s := range ss {
				if p.namespace == "" || s.Namespace == p.namespace {
					touched[o] = true
				} else {
					kept = append(kept, s)
				}
			}
			clear(ss[len(kept):])
			if len(kept) == 0 {
				delete(h.byOrigin, o)
			} else {
				h.byOrigin[o] = kept
			}
		}
		twins := r.twins(h, p.namespace)
		for k, s := range objs {
			if s.origin == "" {
				continue
			}
			if o := old[k]; o != s {
				r.checkReplays(h, o, s, out)
			}
			h.addWith(s, twins[k])
			touched[s.origin] = true
		}
		first := !h.listed
		p.listed = true
		h.listed = true
		for _, q := range h.parts {
			h.listed = h.listed && q.listed
		}
		h.listedOnce.Store(h.listed)
		first = first && h.listed
		if !h.listed {
			return // it contributes nothing before every part listed
		}
		if first {
			// Every origin h holds, from every part: a part that listed
			// before the others wrote nothing then.
			for o := range h.byOrigin {
				touched[o] = true
			}
			all := true
			for _, g := range r.hubs {
				all = all && g.listed
			}
			if all && !r.allSynced {
				// From now on a record no hub holds goes: every origin known
				// (from a snapshot too) is written again.
				r.allSynced = true
				for o := range r.origins {
					touched[o] = true
				}
			}
		}
		for o := range touched {
			r.syncOrigin(o, out)
		}
	})
}

// add indexes s under its origin, its entries pointing at the records the
// store holds when equal, and at another hub's entries of the slice when
// those are the same (Relay.share).
func (h *hub) add(s *slimSlice) { h.addWith(s, h.r.twin(h, s)) }

// addWith is add, twin being another hub's slice of s's key (nil: none).
func (h *hub) addWith(s, twin *slimSlice) {
	h.r.share(s)
	shareEntries(s, twin)
	h.byOrigin[s.origin] = append(h.byOrigin[s.origin], s)
}

// remove drops the slice of s's key from its origin's. A list rather than a
// map keyed by slice (whose keys would be one more copy of each slice's
// name): a change of one slice costs a pass over every slice of its origin
// in syncOrigin anyway.
func (h *hub) remove(s *slimSlice) {
	ss := h.byOrigin[s.origin]
	for i, x := range ss {
		if x.Name == s.Name && x.Namespace == s.Namespace {
			last := len(ss) - 1
			ss[i] = ss[last]
			ss[last] = nil
			ss = ss[:last]
			break
		}
	}
	if len(ss) == 0 {
		delete(h.byOrigin, s.origin)
	} else {
		h.byOrigin[s.origin] = ss
	}
}

// checkReplays reports, under verify, each record of s that changed from
// what old held (or is new) and is older than the statement accepted for
// its Pod, or as old with other bytes: a hub presenting it now replays it.
// A record that a lagging hub still holds unchanged is not reported (it
// arrived before the newer one), only superseded; r.mu is held.
func (r *Relay) checkReplays(h *hub, old, s *slimSlice, out *later) {
	ev := r.cfg.Events.Refused
	if r.cfg.Keys == nil || ev == nil {
		return
	}
	o := r.origins[s.origin]
	if o == nil {
		return
	}
	var before map[string]entry
	if old != nil && old.origin == s.origin && old.Namespace == s.Namespace {
		before = make(map[string]entry, len(old.entries))
		for _, e := range old.entries {
			before[e.rec.Name] = e
		}
	}
	for _, e := range s.entries {
		if b, ok := before[e.rec.Name]; ok && b.seq == e.seq && b.hash == e.hash {
			continue
		}
		m := o.seen[s.Namespace+"/"+e.rec.Name]
		if m == nil || e.seq > m.seq || (e.seq == m.seq && e.hash == m.hash) {
			continue
		}
		detail := fmt.Sprintf("statement seq %d, older than seq %d accepted", e.seq, m.seq)
		if e.seq == m.seq {
			detail = fmt.Sprintf("statement seq %d with other bytes than the one accepted", e.seq)
		}
		if !m.gone.IsZero() {
			detail += " before the Pod was deleted"
		}
		hub, origin, ns, name := h.name, s.origin, s.Namespace, e.rec.Name
		*out = append(*out, func() {
			ev(hub, origin, ns, name, annotation.Rejection{Index: -1, Reason: ReasonReplayed, Detail: detail})
		})
	}
}

// current reports whether h is current on origin: it listed, the reader is
// in contact with it, and its Lease says it is in contact with the origin
// (under verify, with a recent heartbeat: heartbeat.go). r.mu is held.
func (h *hub) current(origin string) bool {
	l := h.leases[origin]
	return h.listed && l != nil && h.r.says(l, time.Now()) && h.State() == source.Connected
}

// syncOrigin writes the union of what the synced hubs hold of origin name
// into the record store (through out, which runs under r.write once r.mu is
// released); r.mu and r.write are held. While some hub is current on the
// origin, the Pods are those the current hubs hold: a Pod the origin deleted
// while another hub was cut off goes, although that hub still holds it.
// Without a current hub (every hub cut off, or no Leases), they are those
// any synced hub holds: nothing goes that some hub still holds. Each Pod's
// record is the newest statement any synced hub holds of it.
func (r *Relay) syncOrigin(name string, out *later) {
	if r.ignored(name) {
		return
	}
	o := r.origin(name)
	current := false
	for _, h := range r.hubs {
		current = current || h.current(name)
	}
	if o.expired && current {
		o.expired = false // in contact again: the union comes back
	}
	if o.expired {
		o.records = 0
		*out = append(*out, func() { r.records.ReplaceCluster(name, nil) })
		r.originStateLocked(name, o, out)
		return
	}
	// Which Pods the origin has: those the hubs that count hold (the
	// current ones while there are any). Which statement of each: the
	// newest any listed hub holds, so that a current hub that lags (it has
	// not seen the last statement yet, or a proxy hides that it is gone)
	// never takes a Pod back to an older statement.
	// Under verify, a record older than the origin's newest Pod list and
	// not named in it is in no hub's view (podlist.go).
	var list *podList
	if r.cfg.Keys != nil {
		list = r.newestList(name, o)
	}
	held := map[string]bool{}
	for _, h := range r.hubs {
		if !h.listed || current && !h.current(name) {
			continue
		}
		for _, s := range h.byOrigin[name] {
			for _, e := range s.entries {
				if list.unlisted(s.Namespace, e.rec.Name, e.uid, e.seq) {
					continue
				}
				held[s.Namespace+"/"+e.rec.Name] = true
			}
		}
	}
	best := map[string]entry{} // the statement the union takes for each Pod
	var drops map[string]uint64
	for _, h := range r.hubs {
		if !h.listed {
			continue
		}
		for _, s := range h.byOrigin[name] {
			for _, e := range s.entries {
				k := s.Namespace + "/" + e.rec.Name
				if list.unlisted(s.Namespace, e.rec.Name, e.uid, e.seq) {
					if drops == nil {
						drops = map[string]uint64{}
					}
					drops[h.name+"\x00"+k] = e.seq
					continue
				}
				if !held[k] {
					continue
				}
				c, ok := best[k]
				switch {
				case !ok, e.seq > c.seq:
					best[k] = e
				case e.seq == c.seq && e.hash != c.hash:
					// Two statements of one Seq: the one accepted before stays.
					if m := o.seen[k]; m != nil && m.hash == e.hash {
						best[k] = e
					}
				}
			}
		}
	}
	recs := make([]*store.Pod, 0, len(best))
	now := time.Now()
	if r.cfg.Keys == nil {
		for _, c := range best {
			recs = append(recs, c.rec)
		}
	} else {
		for k, c := range best {
			m := o.seen[k]
			switch {
			case m == nil:
				if !o.admit(k, now) {
					if !o.full {
						o.full = true
						if ev := r.cfg.Events.Refused; ev != nil {
							ns, pod := c.rec.Namespace, c.rec.Name
							*out = append(*out, func() {
								ev("", name, ns, pod, annotation.Rejection{Index: -1, Reason: annotation.ReasonTooMany,
									Detail: fmt.Sprintf("the reader remembers %d Pods of the cluster, the most it does: new ones are ignored", ingest.MaxObjects)})
							})
						}
					}
					continue
				}
				o.seen[k] = &seen{seq: c.seq, hash: c.hash}
				o.remember(k)
			case c.seq > m.seq:
				*m = seen{seq: c.seq, hash: c.hash}
				o.remember(k)
			case c.seq == m.seq && c.hash == m.hash:
				if !m.gone.IsZero() {
					m.gone = time.Time{}
					o.remember(k)
				}
			default:
				continue // replayed (reported as it arrived): the Pod has no record
			}
			recs = append(recs, c.rec)
		}
		for k, m := range o.seen {
			// A Pod no synced hub holds (or whose statement there was
			// refused) has gone: its Seq stays as a tombstone.
			if c, ok := best[k]; m.gone.IsZero() && r.allSynced && (!ok || c.seq != m.seq || c.hash != m.hash) {
				m.gone = now
				o.remember(k)
			}
		}
		o.prune(now)
		r.reportMemory(name, o, out)
		r.reportUnlisted(name, o, drops, out)
	}
	if !r.allSynced {
		// Until every hub listed once, nothing goes: records the union lacks
		// stay as they are (from a snapshot, or a hub not listed yet).
		have := make(map[store.Key]bool, len(recs))
		for _, p := range recs {
			have[p.Key()] = true
		}
		for _, p := range r.records.Pods(name) {
			if !have[p.Key()] {
				recs = append(recs, p)
			}
		}
	}
	o.records = len(recs)
	*out = append(*out, func() { r.records.ReplaceCluster(name, recs) })
	r.originStateLocked(name, o, out)
	// Without verify any name may come and go as an origin: one that no
	// hub holds any more, with no record, is forgotten, so that origins
	// churned or taken out by a hub do not pile up; one the snapshot named
	// only once every hub listed (before, a hub not listed yet may hold
	// it). Under verify the origins are those with a key, and their replay
	// memory is kept; one without (a snapshot's, its key since removed) is
	// forgotten as without verify.
	if (r.cfg.Keys == nil || r.cfg.Keys[name] == nil) && len(recs) == 0 && (o.seed.IsZero() || r.allSynced) && len(r.viewLocked(name).hubs) == 0 {
		delete(r.origins, name)
	}
}

// admit makes room in the memory for one more Pod: it drops expired
// tombstones, then the oldest, when it is full; false when all it holds are
// live.
func (o *origin) admit(k string, now time.Time) bool {
	if len(o.seen) < ingest.MaxObjects {
		return true
	}
	o.prune(now)
	if len(o.seen) < ingest.MaxObjects {
		return true
	}
	var oldest string
	var at time.Time
	for k, m := range o.seen {
		if !m.gone.IsZero() && (oldest == "" || m.gone.Before(at)) {
			oldest, at = k, m.gone
		}
	}
	if oldest == "" {
		return false
	}
	delete(o.seen, oldest)
	o.remember(oldest)
	return true
}

// prune forgets tombstones older than TombstoneTTL.
func (o *origin) prune(now time.Time) {
	live := 0
	for k, m := range o.seen {
		switch {
		case m.gone.IsZero():
			live++
		case now.Sub(m.gone) > TombstoneTTL:
			delete(o.seen, k)
			o.remember(k)
		}
	}
	if live < ingest.MaxObjects {
		o.full = false
	}
}

// leaseChanged applies a change of one of h's Leases.
func (r *Relay) leaseChanged(h *hub, old, l *slimLease) {
	r.locked(func(out *later) {
		touched := map[string]bool{}
		// The Lease held for old's origin goes if it is old's object: a
		// delete hands a new transform of it, so compare keys, not
		// pointers (another Lease naming the same origin stays).
		if old != nil && old.origin != "" && h.leases[old.origin] != nil && h.leases[old.origin].Key() == old.Key() {
			delete(h.leases, old.origin)
			touched[old.origin] = true
		}
		if old != nil && old.pathOrigin != "" && (l == nil || l.pathOrigin != old.pathOrigin) {
			delete(r.paths, beatKey{h.name, old.pathOrigin})
		}
		if l != nil {
			r.notePath(h, l, out)
		}
		if l != nil && r.leaseCounts(l.origin) {
			h.leases[l.origin] = l
			touched[l.origin] = true
		}
		now := time.Now()
		for o := range touched { // once each, after the whole change
			r.leaseLooked(h, o, now, out)
		}
	})
}

// leaseLooked looks at h's Lease of origin o after it changed, and writes
// o again; r.mu is held. The first Pod list of o that verifies changes every
// hub's verdict on o (a Lease without one no longer counts: podlist.go), as
// does the first list by UID (a Lease without one no longer counts), so
// each hub's Lease is looked at then.
func (r *Relay) leaseLooked(h *hub, o string, now time.Time, out *later) {
	if r.cfg.Keys != nil {
		st := r.origin(o)
		was := st.list
		if l := r.newestList(o, st); l != nil && (was == nil || l.byUID() && !was.byUID()) {
			for _, other := range r.hubs {
				if other != h {
					r.noteBeat(other, o, now, out)
					r.noteList(other, o, out)
				}
			}
		}
	}
	r.noteBeat(h, o, now, out)
	r.noteList(h, o, out)
	r.syncOrigin(o, out)
}

// leaseCounts reports whether a hub's Lease on origin is taken: not one of
// the reader's own or direct clusters and, under verify, only of an origin
// whose key the reader has (whose records it could accept at all), so that
// a hub writing Leases of made-up origins grows no memory, series or
// snapshot entries.
func (r *Relay) leaseCounts(origin string) bool {
	return origin != "" && !r.ignored(origin) && (r.cfg.Keys == nil || r.cfg.Keys[origin] != nil)
}

// leasesReplaced applies a complete list of h's Leases.
func (r *Relay) leasesReplaced(h *hub, objs map[string]*slimLease) {
	r.locked(func(out *later) {
		touched := map[string]bool{}
		for o := range h.leases {
			touched[o] = true
		}
		h.leases = map[string]*slimLease{}
		refused := map[string]bool{}
		for _, l := range objs {
			if r.leaseCounts(l.origin) {
				h.leases[l.origin] = l
				touched[l.origin] = true
			}
			if r.notePath(h, l, out) {
				refused[l.pathOrigin] = true
			}
		}
		for k := range r.paths {
			if k.hub == h.name && !refused[k.origin] {
				delete(r.paths, k)
			}
		}
		now := time.Now()
		for o := range touched {
			r.leaseLooked(h, o, now, out)
		}
	})
}

// hubChanged writes every origin again after a hub's state changed: which
// hubs are current, and so the unions and the origins' states, may change.
func (r *Relay) hubChanged() {
	r.locked(func(out *later) {
		for name := range r.origins {
			r.syncOrigin(name, out)
		}
	})
}

// originStateLocked reports a change of the origin's state; r.mu is held.
func (r *Relay) originStateLocked(name string, o *origin, out *later) {
	r.originChangedLocked(name, out)
	v := r.viewLocked(name)
	if v.last.After(o.last) {
		o.last = v.last
	}
	to := v.state
	from := o.state
	if from == to {
		return
	}
	o.state = to
	if ev := r.cfg.Events.OriginState; ev != nil {
		*out = append(*out, func() { ev(name, from, to) })
	}
}

// view is an origin's state as the hubs report it.
type view struct {
	state source.State
	last  time.Time
	hubs  []string
}

// viewLocked derives an origin's state, last contact and hubs; r.mu is
// held. Connected while some connected hub's Lease says connected (last
// contact: the latest such hub's); Disconnected when a Lease says so, or
// says connected on a disconnected hub; Syncing otherwise (no Lease yet, a
// Lease saying syncing, hubs not listed yet), as a source before its first
// list; Disconnected too once every hub listed and none holds it. The last
// contact is the latest of each hub's renewTime while its Lease does not
// say connected, each hub's own last contact while it does, and the seed;
// with no hub holding the origin, the last the hubs gave (origin.last).
//
// Under verify a Lease says connected only with a recent heartbeat (one
// saying so without it counts as saying disconnected), and the last
// contact is the newest heartbeat that verifies any hub holds, whatever its
// Lease says, or the seed: renewTime and the hub's own contact are the
// hub's word alone (beatAt: through a Lease that withholds the Pod list,
// the newest list seen).
func (r *Relay) viewLocked(name string) view {
	var v view
	lost := false
	o := r.origins[name]
	now := time.Now()
	for _, h := range r.hubs {
		l := h.leases[name]
		if l != nil || len(h.byOrigin[name]) > 0 {
			v.hubs = append(v.hubs, h.name)
		}
		if l == nil {
			continue
		}
		last := l.renew
		if r.cfg.Keys != nil {
			last = r.beatAt(l, now)
		}
		switch {
		case l.state == source.Connected && r.says(l, now):
			if r.cfg.Keys == nil {
				last = h.LastContact()
			}
			switch h.State() {
			case source.Connected:
				v.state = source.Connected
			case source.Disconnected:
				lost = true
			}
		case l.state == source.Disconnected, l.state == source.Connected:
			lost = true // says so, or says connected without a recent heartbeat
		}
		if last.After(v.last) {
			v.last = last
		}
	}
	if o != nil && o.seed.After(v.last) {
		v.last = o.seed
	}
	if o != nil && len(v.hubs) == 0 && o.last.After(v.last) {
		v.last = o.last
	}
	// Once every hub listed, an origin none of them holds (a verifying
	// reader remembers it, or a snapshot named it) is out of reach, not
	// about to sync.
	if v.state != source.Connected && (lost || len(v.hubs) == 0 && r.allSynced) {
		v.state = source.Disconnected
	}
	return v
}
