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
	seen    map[string]*seen
	records int       // written last
	seed    time.Time // last contact from a snapshot
	state   source.State
	full    bool // a new Pod was refused for a full memory (reported once)
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

// later runs what the Relay calls out (events) once r.mu is released.
type later []func()

func (l later) run() {
	for _, f := range l {
		f()
	}
}

// report hands the refusals of a slice's transform to Events.Refused.
func (r *Relay) report(hub string, s *slimSlice) {
	ev := r.cfg.Events.Refused
	if ev == nil {
		return
	}
	for _, f := range s.refused {
		ev(hub, s.originLabel(), s.Namespace, f.pod, f.r)
	}
}

// originLabel is the origin a slice names, for a refusal's report.
func (s *slimSlice) originLabel() string {
	if s.origin != "" {
		return s.origin
	}
	return s.label
}

// sliceChanged applies a change of one of h's slices (old nil: new; s nil:
// deleted).
func (r *Relay) sliceChanged(h *hub, old, s *slimSlice) {
	var out later
	defer out.run()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	touched := map[string]bool{}
	if old != nil && old.origin != "" {
		h.remove(old)
		touched[old.origin] = true
	}
	if s != nil && s.origin != "" {
		r.checkReplays(h, old, s, &out)
		h.add(s)
		touched[s.origin] = true
	}
	if !h.listed {
		return // it contributes nothing before its first list
	}
	for o := range touched {
		r.syncOrigin(o, &out)
	}
}

// slicesReplaced applies a complete list of h's slices.
func (r *Relay) slicesReplaced(h *hub, old, objs map[string]*slimSlice) {
	var out later
	defer out.run()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	touched := map[string]bool{}
	for o := range h.byOrigin {
		touched[o] = true
	}
	h.byOrigin = map[string]map[string]*slimSlice{}
	for k, s := range objs {
		if s.origin == "" {
			continue
		}
		if o := old[k]; o != s {
			r.checkReplays(h, o, s, &out)
		}
		h.add(s)
		touched[s.origin] = true
	}
	first := !h.listed
	h.listed = true
	if first {
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
		r.syncOrigin(o, &out)
	}
}

func (h *hub) add(s *slimSlice) {
	m := h.byOrigin[s.origin]
	if m == nil {
		m = map[string]*slimSlice{}
		h.byOrigin[s.origin] = m
	}
	m[s.Key()] = s
}

func (h *hub) remove(s *slimSlice) {
	m := h.byOrigin[s.origin]
	delete(m, s.Key())
	if len(m) == 0 {
		delete(h.byOrigin, s.origin)
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

// candidate is the statement a union takes for one Pod.
type candidate struct {
	entry
	hubs int // how many hubs hold it
}

// syncOrigin writes the union of what the synced hubs hold of origin name
// into the record store; r.mu is held.
func (r *Relay) syncOrigin(name string, out *later) {
	if r.ignored(name) {
		return
	}
	o := r.origin(name)
	best := map[string]*candidate{}
	for _, h := range r.hubs {
		if !h.listed {
			continue
		}
		for _, s := range h.byOrigin[name] {
			for _, e := range s.entries {
				k := s.Namespace + "/" + e.rec.Name
				c := best[k]
				switch {
				case c == nil:
					best[k] = &candidate{entry: e, hubs: 1}
				case e.seq > c.seq:
					c.entry = e
				case e.seq == c.seq && e.hash != c.hash:
					// Two statements of one Seq: the one accepted before stays.
					if m := o.seen[k]; m != nil && m.hash == e.hash {
						c.entry = e
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
			case c.seq > m.seq:
				*m = seen{seq: c.seq, hash: c.hash}
			case c.seq == m.seq && c.hash == m.hash:
				m.gone = time.Time{}
			default:
				continue // replayed (reported as it arrived): the Pod has no record
			}
			recs = append(recs, c.rec)
		}
		for k, m := range o.seen {
			// A Pod no synced hub holds (or whose statement there was
			// refused) has gone: its Seq stays as a tombstone.
			if m.gone.IsZero() && r.allSynced && !r.accepted(best[k], m) {
				m.gone = now
			}
		}
		o.prune(now)
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
	r.records.ReplaceCluster(name, recs)
	r.originStateLocked(name, o, out)
}

// accepted reports whether c is the statement m remembers.
func (r *Relay) accepted(c *candidate, m *seen) bool {
	return c != nil && c.seq == m.seq && c.hash == m.hash
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
		}
	}
	if live < ingest.MaxObjects {
		o.full = false
	}
}

// leaseChanged applies a change of one of h's Leases.
func (r *Relay) leaseChanged(h *hub, old, l *slimLease) {
	var out later
	defer out.run()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	if old != nil && old.origin != "" && h.leases[old.origin] == old {
		delete(h.leases, old.origin)
		r.originStateLocked(old.origin, r.origin(old.origin), &out)
	}
	if l != nil && l.origin != "" && !r.ignored(l.origin) {
		h.leases[l.origin] = l
		r.originStateLocked(l.origin, r.origin(l.origin), &out)
	}
}

// leasesReplaced applies a complete list of h's Leases.
func (r *Relay) leasesReplaced(h *hub, objs map[string]*slimLease) {
	var out later
	defer out.run()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	touched := map[string]bool{}
	for o := range h.leases {
		touched[o] = true
	}
	h.leases = map[string]*slimLease{}
	for _, l := range objs {
		if l.origin != "" && !r.ignored(l.origin) {
			h.leases[l.origin] = l
			touched[l.origin] = true
		}
	}
	for o := range touched {
		r.originStateLocked(o, r.origin(o), &out)
	}
}

// hubChanged re-derives every origin's state after a hub's changed.
func (r *Relay) hubChanged() {
	var out later
	defer out.run()
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, o := range r.origins {
		r.originStateLocked(name, o, &out)
	}
}

// originStateLocked reports a change of the origin's state; r.mu is held.
func (r *Relay) originStateLocked(name string, o *origin, out *later) {
	to := r.viewLocked(name).state
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
// contact: the latest such hub's); otherwise the latest of each hub's
// renewTime while its Lease says otherwise and each hub's own last contact
// while its Lease says connected, and the seed.
func (r *Relay) viewLocked(name string) view {
	var v view
	o := r.origins[name]
	for _, h := range r.hubs {
		l := h.leases[name]
		if l != nil || len(h.byOrigin[name]) > 0 {
			v.hubs = append(v.hubs, h.name)
		}
		if l == nil {
			continue
		}
		last := l.renew
		if l.state == source.Connected {
			last = h.LastContact()
			if h.State() == source.Connected {
				v.state = source.Connected
			}
		}
		if last.After(v.last) {
			v.last = last
		}
	}
	if o != nil && o.seed.After(v.last) {
		v.last = o.seed
	}
	if v.state != source.Connected && !v.last.IsZero() {
		v.state = source.Disconnected
	}
	return v
}
