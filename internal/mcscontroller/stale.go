package mcscontroller

import (
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// The exporter's stale policy (annotation.StaleEndpointsAnnotation) applies
// to the EndpointSlices as to CoreDNS's answers, by the same rule
// (annotation.Service.DropsStale): the share of a peer out of contact for
// longer than its export's grace is left out (its slices deleted, its
// place in the ServiceImport gone), for DropIfLocal only while the local
// cluster has ready endpoints of the service; it comes back when the peer
// answers. --peer-expire, when shorter, drops the whole peer sooner: the
// stricter wins, as in CoreDNS.

// staleGrace is how long after its last contact (or the controller's
// start) a cluster counts as in contact, as CoreDNS's stale mark counts
// it: one failed check does not drop a service's endpoints.
const staleGrace = source.StaleGrace

// reasonStaleDropped notes a share left out by its stale policy: logged
// and recorded as a Normal Event, not a refusal.
const reasonStaleDropped = "StaleEndpointsDropped"

// outOfContact is how long s has been out of contact for the stale
// policies: 0 while it is connected or within staleGrace of its last
// contact (or of started, when later), else the time since its last
// contact (since started when it never had one).
func outOfContact(s Source, started, now time.Time) time.Duration {
	if s.Connected() {
		return 0
	}
	last := s.LastContact()
	since := last
	if started.After(since) {
		since = started
	}
	if now.Sub(since) <= staleGrace {
		return 0
	}
	if last.IsZero() {
		return now.Sub(started)
	}
	return now.Sub(last)
}

// dropStale applies e's stale policy to the share of a cluster out of
// contact for out: whether it is left out now and, when it is kept but its
// grace has not passed yet, how long until it has (0: no change comes by
// time alone). hasLocal says whether the local cluster has ready endpoints
// of the service.
func dropStale(e *annotation.Export, out time.Duration, hasLocal func() bool) (drop bool, recheck time.Duration) {
	if out <= 0 {
		return false, 0 // in contact: a change of state looks at every service again
	}
	if e.DropsStale(out, hasLocal) {
		return true, 0
	}
	if grace, _, ok := e.DropGrace(); ok && out <= grace {
		return false, grace - out + time.Millisecond
	}
	return false, 0
}

// hasReady says whether a share has a ready endpoint with an address (the
// local cluster's, for DropIfLocal), as CoreDNS's answers count one.
func hasReady(s *share) bool {
	if s == nil {
		return false
	}
	for _, ep := range s.endpoints {
		if ep.Ready && len(ep.Addresses) > 0 {
			return true
		}
	}
	return false
}
