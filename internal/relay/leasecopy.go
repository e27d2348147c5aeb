package relay

import (
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/validation"
)

// A hub reading hubs re-publishes, in its own Lease of each relayed origin,
// what it heard of it: the state and last contact its Relay sees and the
// annotations of the hub Lease that tells it (OriginLeases),
// those it does not know of too (an origin-signed heartbeat, say), copied
// unchanged.

// leaseExtraPrefix: the annotations of a hub's Lease a hub copies on.
const leaseExtraPrefix = "multicluster.mcsannotations.io/"

// keepLease sets s's extra annotations from l, for a Relay that keeps
// proofs (a hub), when l has any: every annotation under leaseExtraPrefix
// but OriginStateAnnotation, at most what the API server allows on one
// object.
func (r *Relay) keepLease(s *slimLease, l *coordinationv1.Lease) *slimLease {
	if !r.cfg.KeepProof {
		return s
	}
	size := 0
	for k, v := range l.Annotations {
		if k == OriginStateAnnotation || !strings.HasPrefix(k, leaseExtraPrefix) {
			continue
		}
		if size += len(k) + len(v); size > validation.TotalAnnotationSizeLimitB {
			return s
		}
		if s.extra == nil {
			s.extra = map[string]string{}
		}
		s.extra[k] = v
	}
	return s
}

// OriginLease is an origin as Origins gives it, with Extra: the
// annotations to copy on into a hub's own Lease of it (nil unless
// Config.KeepProof), those of the Lease of the hub the reader is current
// with on the origin, else of the latest renewed Lease of it. Extra must
// not be modified.
type OriginLease struct {
	Origin
	Extra map[string]string
}

// OriginLeases returns every origin with its Lease's Extra, sorted by
// cluster, under one hold of the lock (a hub's controller looks at every
// origin every second).
func (r *Relay) OriginLeases() []OriginLease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]OriginLease, 0, len(r.origins))
	for name := range r.origins {
		out = append(out, OriginLease{Origin: r.originLocked(name), Extra: r.leaseExtraLocked(name)})
	}
	slices.SortFunc(out, func(a, b OriginLease) int { return cmpString(a.Cluster, b.Cluster) })
	return out
}

// leaseExtraLocked is origin's OriginLease.Extra; r.mu is held.
func (r *Relay) leaseExtraLocked(origin string) map[string]string {
	var best *slimLease
	bestCurrent := false
	for _, h := range r.hubs {
		l := h.leases[origin]
		if l == nil {
			continue
		}
		cur := h.current(origin)
		if best == nil || cur && !bestCurrent || cur == bestCurrent && l.renew.After(best.renew) {
			best, bestCurrent = l, cur
		}
	}
	if best == nil {
		return nil
	}
	return best.extra
}
