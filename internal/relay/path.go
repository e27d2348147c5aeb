package relay

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Hubs reading hubs (regions of regions). A hub whose controller reads
// other hubs relays their origins too (Config.KeepProof keeps what it needs
// to): each record with the origin's bytes unchanged and its path, the hubs
// it crossed, the writer last (Slice.Paths). A reader refuses a record whose
// path names itself or more than MaxPath hubs (checkPath), and a hub relays
// no record that crossed MaxPath hubs already (EncodeVia). So a record held
// by a hub with a path of n hubs stands on a record the path's last hub
// holds with the first n-1 of them: once the origin's Pod is gone, the
// records with paths of one hub go (their hubs read the origin), then those
// of two, and so on; none can be held up by its own copy going round, since
// a path never names a hub twice, and none is longer than MaxPath.

// checkPath says why a record with path is refused ("" when it is not).
func (r *Relay) checkPath(path []string) (annotation.Reason, string) {
	if len(path) > MaxPath {
		return ReasonLoop, fmt.Sprintf("relay path of %d hubs, over %d", len(path), MaxPath)
	}
	for _, h := range path {
		if msgs := validation.IsDNS1123Subdomain(h); len(msgs) > 0 || len(h) > 127 {
			return ReasonMalformed, fmt.Sprintf("relay path names %q, no cluster ID", annotation.Clip(h))
		}
	}
	if r.throughReader(path) {
		return ReasonLoop, fmt.Sprintf("relay path %s names this cluster: it relayed the record itself", JoinPath(path))
	}
	return "", ""
}

// throughReader reports whether path names the reader: its own word, come
// back through hubs reading each other.
func (r *Relay) throughReader(path []string) bool {
	return r.cfg.Local != "" && slices.Contains(path, r.cfg.Local)
}

// notePath reports, through out, h's Lease l refused for its relay path
// (slimLease.pathRefused) when the refusal differs from the one last
// reported for its origin through h (once per change, not per renewal),
// and forgets that report once the hub's Lease of the origin is taken. It
// says whether l is such a refusal. Only an origin whose Lease could count
// is kept (leaseCounts: under verify, one with a key), so that a hub
// writing Leases of made-up origins grows no memory. r.mu is held.
func (r *Relay) notePath(h *hub, l *slimLease, out *later) bool {
	if l.origin != "" {
		delete(r.paths, beatKey{h.name, l.origin})
		return false
	}
	if l.pathOrigin == "" || !r.leaseCounts(l.pathOrigin) {
		return false
	}
	k := beatKey{h.name, l.pathOrigin}
	if r.paths[k] == l.pathRefused.Detail {
		return true
	}
	r.paths[k] = l.pathRefused.Detail
	if ev := r.cfg.Events.Refused; ev != nil {
		hub, origin, rej := h.name, l.pathOrigin, l.pathRefused
		*out = append(*out, func() { ev(hub, origin, "", "", rej) })
	}
	return true
}

// withProof is common with its own copy carrying the proof of p, a Pod of
// a relay slice whose export annotation is export and path path.
func withProof(common *store.Common, p Pod, export string, path []string) *store.Common {
	c := *common
	c.Proof = &store.Proof{UID: p.UID, Export: export, Endpoint: p.Endpoint, EndpointSignature: p.Signature, Path: JoinPath(path)}
	return &c
}
