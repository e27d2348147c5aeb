package relay

// Origin returns what the Relay knows of one origin, as Origins does; false
// when it knows no such origin (never named, or forgotten).
func (r *Relay) Origin(name string) (Origin, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.origins[name]
	if o == nil {
		return Origin{}, false
	}
	v := r.viewLocked(name)
	return Origin{Cluster: name, Hubs: v.hubs, State: v.state, LastContact: v.last, Records: o.records, Expired: o.expired}, true
}

// originChangedLocked queues Events.OriginChanged of origin name, after a
// write of its records and state; r.mu is held. It runs once r.mu is
// released, after the origin was forgotten if it was.
func (r *Relay) originChangedLocked(name string, out *later) {
	if ev := r.cfg.Events.OriginChanged; ev != nil {
		*out = append(*out, func() { ev(name) })
	}
}
