package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// Heartbeats (annotation.Heartbeat, HeartbeatAnnotation). Without verify a
// reader takes a hub's word on an origin's state and last contact. Under
// verify the word "connected" counts only while the hub's Lease carries a
// heartbeat that verifies with the origin's key, names the origin, is not
// more than HeartbeatSkew ahead of the reader's clock and not older than
// Config.HeartbeatTimeout: a hub that keeps saying an origin is connected
// after the origin stopped beating (it is cut off, or the hub lies) leaves
// the origin stale through that hub, its records kept as for a hub cut off.
// The origin's last contact is then its newest such heartbeat any hub
// holds: a hub can present an older one, which only makes it look staler,
// never a newer one.

// Reasons of the refusal of a hub's word that an origin is connected.
const (
	// ReasonHeartbeat: under verify, a hub's Lease says its origin is
	// connected without a heartbeat that verifies (none, unsigned, a bad
	// signature, malformed, or another origin's).
	ReasonHeartbeat annotation.Reason = "bad_heartbeat"
	// ReasonStaleHeartbeat: under verify, a hub's Lease says its origin is
	// connected with a heartbeat older than Config.HeartbeatTimeout, or more
	// than HeartbeatSkew ahead of the reader's clock.
	ReasonStaleHeartbeat annotation.Reason = "stale_heartbeat"
)

// DefaultHeartbeatTimeout is Config.HeartbeatTimeout's default: a few of
// the annotator's default heartbeat intervals (--heartbeat-interval), so
// that a late write or a leader's handover does not turn an origin stale.
const DefaultHeartbeatTimeout = 5 * time.Minute

// HeartbeatSkew is how far ahead of the reader's clock a heartbeat may be
// (the clocks of two clusters differ a little).
const HeartbeatSkew = 30 * time.Second

// beatKey names one hub's Lease of one origin.
type beatKey struct{ hub, origin string }

// heartbeatTimeout is Config.HeartbeatTimeout or its default.
func (r *Relay) heartbeatTimeout() time.Duration {
	if r.cfg.HeartbeatTimeout > 0 {
		return r.cfg.HeartbeatTimeout
	}
	return DefaultHeartbeatTimeout
}

// checkBeat verifies, as a Lease arrives, the heartbeat raw and its
// signature sig with the key of the Lease's origin (which must have one:
// see leaseCounts), into l.
func (r *Relay) checkBeat(l *slimLease, raw, sig string) {
	l.beatHash = hash(raw, sig)
	key := r.cfg.Keys[l.origin]
	if key == nil {
		l.beatRefused = annotation.Rejection{Index: -1, Reason: ReasonNoKey, Detail: "no key for cluster " + l.origin}
		return
	}
	hb, rej, ok := annotation.VerifyHeartbeat(key, sig, l.origin, raw)
	if !ok {
		l.beatRefused = rej
		return
	}
	l.beat = hb.At()
}

// beatAt is the time of l's heartbeat that counts at now: zero when it has
// none that verifies, or one too far ahead; for a Lease that withholds the
// Pod list written with its heartbeat (podlist.go), the newest list seen
// (zero for none; of lists by UID only, when those are required): a
// heartbeat without its list proves the origin alive, not that the hub's
// view of it is whole. r.mu is held.
func (r *Relay) beatAt(l *slimLease, now time.Time) time.Time {
	switch {
	case l.beat.After(now.Add(HeartbeatSkew)):
		return time.Time{}
	case r.withholds(l):
		if seen := r.seenList(l.origin); seen != nil && (seen.byUID() || !r.cfg.RequirePodUIDLists) {
			return time.UnixMilli(int64(seen.at))
		}
		return time.Time{} // lists required, none seen: the Lease proves no contact
	}
	return l.beat
}

// beatVerdict tells whether l's word is taken at now: always without
// verify or when it does not say connected; under verify, when it says
// connected, only with a recent heartbeat and, once a Pod list of the
// origin was seen, a list as new as it (podlist.go). Else the reason says
// why; beatRefusal words it, only where a refusal is reported. r.mu is
// held.
func (r *Relay) beatVerdict(l *slimLease, now time.Time) (annotation.Reason, bool) {
	switch {
	case r.cfg.Keys == nil || l.state != source.Connected:
		return "", true
	case l.beat.IsZero():
		return ReasonHeartbeat, false
	case l.beat.After(now.Add(HeartbeatSkew)), now.Sub(l.beat) >= r.heartbeatTimeout():
		return ReasonStaleHeartbeat, false
	case r.withholds(l):
		return ReasonWithheldPodList, false
	}
	return "", true
}

// beatRefusal is the refusal of l's word at now for reason, a reason
// beatVerdict gave, with the detail that says why. r.mu is held.
func (r *Relay) beatRefusal(l *slimLease, now time.Time, reason annotation.Reason) annotation.Rejection {
	beat := l.beat.UTC().Format(time.RFC3339Nano)
	var d string
	switch {
	case reason == ReasonHeartbeat:
		d = fmt.Sprintf("the hub says cluster %s is connected without a heartbeat of it that verifies (%s): the origin counts as cut off through this hub", l.origin, l.beatRefused.Detail)
	case reason == ReasonWithheldPodList:
		d = fmt.Sprintf("the hub says cluster %s is connected with a heartbeat of %s and %s: a hub withholding the origin's Pod lists could keep its deleted Pods, so the origin counts as cut off through this hub", l.origin, beat, r.withheldWhy(l))
	case l.beat.After(now.Add(HeartbeatSkew)):
		d = fmt.Sprintf("the hub says cluster %s is connected with a heartbeat of %s, more than %v ahead of this clock: the origin counts as cut off through this hub", l.origin, beat, HeartbeatSkew)
	default:
		d = fmt.Sprintf("the hub says cluster %s is connected, yet its last heartbeat is of %s, over %v ago: the origin counts as cut off through this hub", l.origin, beat, r.heartbeatTimeout())
	}
	return annotation.Rejection{Index: -1, Reason: reason, Detail: d}
}

// says reports whether l, at now, says its origin is connected and is
// taken at its word.
func (r *Relay) says(l *slimLease, now time.Time) bool {
	if l.state != source.Connected {
		return false
	}
	_, ok := r.beatVerdict(l, now)
	return ok
}

// noteBeat looks at h's Lease of origin at now and reports, through out,
// its refusal when it differs from the one last reported for it (once per
// change, not per look); it says whether the verdict changed, so that the
// caller writes the origin again. r.mu is held.
func (r *Relay) noteBeat(h *hub, origin string, now time.Time, out *later) bool {
	if r.cfg.Keys == nil {
		return false
	}
	k := beatKey{h.name, origin}
	l := h.leases[origin]
	if l == nil {
		_, had := r.beats[k]
		delete(r.beats, k)
		return had
	}
	// What is compared is the verdict, not its detail's times: a hub
	// passing an origin's fresh heartbeats without their lists, or ones
	// far ahead, changes them at every heartbeat, and is reported once.
	var said string
	reason, ok := r.beatVerdict(l, now)
	switch {
	case ok:
	case reason == ReasonHeartbeat:
		said = string(reason) + " " + l.beatRefused.Detail // why it does not verify
	default:
		said = string(reason)
	}
	before, had := r.beats[k]
	r.beats[k] = said
	if had && before == said || !had && said == "" {
		return false
	}
	if ev := r.cfg.Events.Refused; ev != nil && !ok {
		hub, rej := h.name, r.beatRefusal(l, now, reason)
		*out = append(*out, func() { ev(hub, origin, "", "", rej) })
	}
	return true
}

// beatTick is how often the heartbeats are looked at: a fraction of the
// timeout, so that an origin turns stale soon after its last heartbeat
// gets too old, without an event from the hub.
func (r *Relay) beatTick() time.Duration {
	return min(max(r.heartbeatTimeout()/10, 50*time.Millisecond), 15*time.Second)
}

// runHeartbeats looks at every hub's Leases every beatTick until ctx is
// done, and writes again each origin whose Lease's verdict changed (a
// heartbeat that got too old, or one that was ahead and is not any more).
func (r *Relay) runHeartbeats(ctx context.Context) {
	t := time.NewTicker(r.beatTick())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.locked(func(out *later) {
			now := time.Now()
			touched := map[string]bool{}
			for _, h := range r.hubs {
				for o := range h.leases {
					if r.noteBeat(h, o, now, out) {
						touched[o] = true
					}
				}
			}
			for o := range touched {
				r.syncOrigin(o, out)
			}
		})
	}
}
