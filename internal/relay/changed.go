package relay

// Origin returns what the Relay knows of one origin, as Origins does; false
// when it knows no such origin (never named, or forgotten).
func (r *Relay) Origin(name string) (Origin, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.origins[name] == nil {
		return Origin{}, false
	}
	return r.originLocked(name), true
}

// originChangedLocked queues Events.OriginChanged of origin name, after a
// write of its records and state; r.mu is held. It runs once r.mu is
// released, after the origin was forgotten if it was.
func (r *Relay) originChangedLocked(name string, out *later) {
	if ev := r.cfg.Events.OriginChanged; ev != nil {
		*out = append(*out, func() { ev(name) })
	}
}
