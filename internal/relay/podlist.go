package relay

import (
	"fmt"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Pod lists (annotation.PodList, PodListAnnotation). A heartbeat proves the
// origin is alive, not which Pods it has: a hub could keep presenting a
// deleted Pod's last statement, and while it passes fresh heartbeats it is
// current on the origin, so the union keeps the Pod. Under verify, the
// reader takes the newest Pod list of the origin that verifies with its key,
// whichever hub's Lease carried it (the list is the origin's word, not the
// hub's: a hub can withhold it, not make one up), and drops from every
// hub's view of the origin each record whose statement is older than the
// list (Seq < its time) and whose Pod it does not name: that Pod was gone
// when the origin wrote the list. A statement signed after the list has a
// Seq no smaller than its time (the annotator sees to it) and is kept.
// Without a list that verifies nothing is dropped, as before lists; a hub's
// Lease whose heartbeat verifies but whose list does not (none, or a bad
// one) is reported once per change (ReasonNoPodList).
//
// A hub could then defeat the rule by withholding the lists while passing
// fresh heartbeats. So once the reader has seen a list of an origin that
// verifies (the origin writes them: its annotator, and the hub's relay,
// know them), a hub's word that the origin is connected counts only while
// its Lease carries a list that verifies and is as new as its heartbeat:
// else the origin counts as cut off through that hub (ReasonWithheldPodList,
// in beatVerdict), its records kept as for a hub cut off and expired after
// expire. An origin over annotation.MaxPodListPods writes a list that names
// none (annotation.PodList.Over): it counts as a list, drops nothing. What
// the reader has seen is kept in memory: after a restart, until it sees a
// list again, a hub's Lease without one is taken as before lists, unless
// Config.RequirePodLists says lists are required from the start.
//
// Lists by UID (annotation.PodUIDListAnnotation) name Pods by their UIDs
// too, so that the old statement of a Pod made again under its name (a
// StatefulSet's) is dropped once the origin lists the new Pod. A Lease's
// list by UID is taken when it verifies, its list by name otherwise. Once a
// list by UID of an origin was seen, only lists by UID are taken of it, and
// a hub's Lease that carries none (an older hub, or one that strips it to
// have the old statement kept) is taken as withholding lists; so from the
// start with Config.RequirePodUIDLists.

// Reasons of the Pod list rule.
const (
	// ReasonUnlisted: under verify, a record older than the newest Pod list
	// of its origin that verifies, and of a Pod the list does not name.
	ReasonUnlisted annotation.Reason = "unlisted"
	// ReasonNoPodList: under verify, before any Pod list of the origin
	// that verifies was seen, a hub's Lease with a heartbeat that verifies
	// and no Pod list that does (none: an older annotator or hub, or a hub
	// that withholds it; or one unsigned, mis-signed or malformed).
	// Nothing is dropped on that Lease's word.
	ReasonNoPodList annotation.Reason = "no_pod_list"
	// ReasonWithheldPodList: under verify, after a Pod list of the origin
	// that verifies was seen, a hub's Lease says the origin is connected
	// without a list that verifies as new as its heartbeat: the origin
	// counts as cut off through that hub.
	ReasonWithheldPodList annotation.Reason = "withheld_pod_list"
)

// podList is a verified Pod list: its time (Unix milliseconds) and Pods.
type podList struct {
	at   uint64
	pods annotation.PodSet
}

// byUID tells whether p is a list by UID.
func (p *podList) byUID() bool { return p != nil && p.pods.ByUID() }

// unlisted reports whether the list drops the record of namespace/name
// whose statement has seq and whose Pod has uid (annotation.PodUIDHash):
// never for a list over the cap, which names none.
func (p *podList) unlisted(namespace, name string, uid, seq uint64) bool {
	if p == nil || p.pods.Over() || seq >= p.at {
		return false
	}
	if p.byUID() {
		return !p.pods.HasHash(uid)
	}
	return !p.pods.Has(namespace, name)
}

// newer tells whether list a is to be taken over b: a list by UID over one
// by name, else the newer of the same kind.
func (a *podList) newer(b *podList) bool {
	if b == nil || a.byUID() != b.byUID() {
		return b == nil || a.byUID()
	}
	return a.at > b.at
}

// seenList is, under verify, the newest Pod list of origin that verified,
// nil while none has been seen; r.mu is held.
func (r *Relay) seenList(origin string) *podList {
	if o := r.origins[origin]; o != nil {
		return o.list
	}
	return nil
}

// listsRequired tells whether a hub's Lease of origin must carry a Pod
// list: one of the origin was seen, or Config.RequirePodLists; r.mu is
// held.
func (r *Relay) listsRequired(origin string) bool {
	return r.cfg.RequirePodLists || r.cfg.RequirePodUIDLists || r.seenList(origin) != nil
}

// uidListsRequired tells whether a hub's Lease of origin must carry a list
// by UID: one of the origin was seen, or Config.RequirePodUIDLists; r.mu is
// held.
func (r *Relay) uidListsRequired(origin string) bool {
	return r.cfg.RequirePodUIDLists || r.seenList(origin).byUID()
}

// withholds tells whether l, a Lease of an origin whose lists are required,
// lacks a list that verifies as new as its heartbeat; r.mu is held.
func (r *Relay) withholds(l *slimLease) bool {
	return r.listsRequired(l.origin) && (l.list == nil || int64(l.list.at) < l.beat.UnixMilli() ||
		!l.list.byUID() && r.uidListsRequired(l.origin))
}

// withheldWhy says what l lacks, when withholds(l).
func (r *Relay) withheldWhy(l *slimLease) string {
	if l.list == nil {
		seen := r.seenList(l.origin)
		if seen == nil {
			return fmt.Sprintf("no Pod list that verifies (%s), and this reader requires them", l.listRefused.Detail)
		}
		return fmt.Sprintf("no Pod list that verifies (%s), although one of %s was seen", l.listRefused.Detail, time.UnixMilli(int64(seen.at)).UTC().Format(time.RFC3339Nano))
	}
	if seen := r.seenList(l.origin); !l.list.byUID() && r.uidListsRequired(l.origin) {
		if !seen.byUID() {
			return fmt.Sprintf("no Pod list by UID that verifies (%s), and this reader requires them", l.listRefused.Detail)
		}
		return fmt.Sprintf("no Pod list by UID that verifies (%s), although one of %s was seen", l.listRefused.Detail, time.UnixMilli(int64(seen.at)).UTC().Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("a Pod list of %s, older than the heartbeat", time.UnixMilli(int64(l.list.at)).UTC().Format(time.RFC3339Nano))
}

// checkList verifies, as a Lease arrives, the Pod list by UID uraw and its
// signature usig with the key of the Lease's origin, into l; when that does
// not verify, the list by name raw and its signature sig.
func (r *Relay) checkList(l *slimLease, raw, sig, uraw, usig string) {
	key := r.cfg.Keys[l.origin]
	if key == nil {
		return // refused as a whole (leaseCounts)
	}
	pl, pods, urej, ok := annotation.VerifyPodUIDList(key, usig, l.origin, uraw)
	if !ok {
		var rej annotation.Rejection
		pl, pods, rej, ok = annotation.VerifyPodList(key, sig, l.origin, raw)
		l.listRefused = urej // why there is no list by UID (withheldWhy, once one was seen)
		if !ok && uraw == "" && usig == "" {
			l.listRefused = rej // no list by UID at all: why the list by name is not taken
		}
	}
	if ok {
		l.list = &podList{at: uint64(pl.Time), pods: pods}
	}
}

// newestList is the newest Pod list of origin o that verifies, among those
// the hubs' Leases carry now and the one taken before (a list stays true of
// what it says after its Lease changes or goes); r.mu is held.
func (r *Relay) newestList(name string, o *origin) *podList {
	for _, h := range r.hubs {
		if l := h.leases[name]; l != nil && l.list != nil && l.list.newer(o.list) {
			o.list = l.list
		}
	}
	return o.list
}

// noteList reports, through out, that h's Lease of origin carries a
// heartbeat that verifies without a Pod list that does, before any list of
// the origin was seen (after, beatVerdict refuses the Lease's word), once
// per change of that; r.mu is held.
func (r *Relay) noteList(h *hub, origin string, out *later) {
	if r.cfg.Keys == nil {
		return
	}
	k := beatKey{h.name, origin}
	l := h.leases[origin]
	said := ""
	if l != nil && !l.beat.IsZero() && l.list == nil && !r.listsRequired(origin) {
		said = l.listRefused.Detail
	}
	if r.lists[k] == said {
		return
	}
	if said == "" {
		delete(r.lists, k)
		return
	}
	r.lists[k] = said
	if ev := r.cfg.Events.Refused; ev != nil {
		hub, rej := h.name, annotation.Rejection{Index: -1, Reason: ReasonNoPodList,
			Detail: fmt.Sprintf("the hub's Lease of cluster %s carries no Pod list that verifies (%s): records of it are not checked against one through this hub", origin, said)}
		*out = append(*out, func() { ev(hub, origin, "", "", rej) })
	}
}

// reportUnlisted reports, through out, the records the Pod list dropped
// (drops: "hub\x00namespace/name" → Seq) that it had not dropped at the
// last look, and keeps drops as what it dropped; r.mu is held.
func (r *Relay) reportUnlisted(name string, o *origin, drops map[string]uint64, out *later) {
	ev := r.cfg.Events.Refused
	if ev != nil {
		for k, seq := range drops {
			if was, ok := o.unlisted[k]; ok && was == seq {
				continue
			}
			hub, key, _ := strings.Cut(k, "\x00")
			ns, pod, _ := strings.Cut(key, "/")
			rej := annotation.Rejection{Index: -1, Reason: ReasonUnlisted,
				Detail: fmt.Sprintf("statement seq %d is older than cluster %s's Pod list of %s, which does not name the Pod: it was gone then, the hub still holds it",
					seq, name, time.UnixMilli(int64(o.list.at)).UTC().Format(time.RFC3339Nano))}
			*out = append(*out, func() { ev(hub, name, ns, pod, rej) })
		}
	}
	o.unlisted = drops
}
