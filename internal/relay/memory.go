package relay

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// The replay memory kept across restarts: under verify, what the Relay
// remembers of each Pod of an origin (the statement accepted last, and for a
// deleted Pod when it went, until TombstoneTTL) is read with Memory, seeded
// at start with SeedMemory (from the snapshot) and reported as it changes
// (Events.Remembered), so that a restart does not forget which statements
// are older than one accepted. Its hash is stable (statementHash), so that a
// remembered statement means the same in the next process.

// Remembered is what the Relay remembers of one Pod of an origin.
type Remembered struct {
	Pod  string // "namespace/name"
	Seq  uint64 // of the statement accepted last
	Hash uint64 // statementHash of it
	// Gone is when the Pod's record went (no hub that counts held it any
	// more); zero while it is held.
	Gone time.Time
}

// statementHash is the hash of a relayed Pod's statement: the first 8 bytes
// (big-endian) of the SHA-256 of each string after its length (8 bytes,
// big-endian). It is the same in every process, so that the replay memory
// means the same after a restart, and a hub cannot find two statements
// that hash alike.
func statementHash(strs ...string) uint64 {
	h := sha256.New()
	var n [8]byte
	for _, s := range strs {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// Memory returns the replay memory of origin, sorted by Pod (empty without
// verify, or for an origin the Relay does not know).
func (r *Relay) Memory(origin string) []Remembered {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.origins[origin]
	if o == nil {
		return nil
	}
	out := make([]Remembered, 0, len(o.seen))
	for k, m := range o.seen {
		out = append(out, Remembered{Pod: k, Seq: m.seq, Hash: m.hash, Gone: m.gone})
	}
	slices.SortFunc(out, func(a, b Remembered) int { return strings.Compare(a.Pod, b.Pod) })
	return out
}

// SeedMemory seeds the replay memory of origin (from a snapshot), before
// Start or at least before any hub holds the origin: a Pod the Relay
// remembers already keeps what it remembers unless mem names a newer
// statement. It takes nothing without verify, nor for an origin without a
// key or whose relayed records are ignored; it drops tombstones older than
// TombstoneTTL (a time of going in the future counts as now), entries whose
// Pod is not "namespace/name", and, past ingest.MaxObjects Pods for the
// origin, the oldest tombstones, then the rest. It returns the Pods it did
// not take, for the caller to forget too.
func (r *Relay) SeedMemory(origin string, mem []Remembered) (dropped []string) {
	if r.cfg.Keys == nil || r.cfg.Keys[origin] == nil || r.ignored(origin) {
		for _, m := range mem {
			dropped = append(dropped, m.Pod)
		}
		return dropped
	}
	now := time.Now()
	take := make([]Remembered, 0, len(mem))
	for _, m := range mem {
		if m.Gone.After(now) {
			m.Gone = now
		}
		if !validPodKey(m.Pod) || !m.Gone.IsZero() && now.Sub(m.Gone) > TombstoneTTL {
			dropped = append(dropped, m.Pod)
			continue
		}
		take = append(take, m)
	}
	// Held Pods first, then the newest tombstones: those are what the
	// bound keeps.
	slices.SortFunc(take, func(a, b Remembered) int {
		switch {
		case a.Gone.IsZero() != b.Gone.IsZero():
			if a.Gone.IsZero() {
				return -1
			}
			return 1
		case !a.Gone.Equal(b.Gone):
			return b.Gone.Compare(a.Gone)
		}
		return cmp.Compare(a.Pod, b.Pod)
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.origin(origin)
	for _, m := range take {
		cur := o.seen[m.Pod]
		switch {
		case cur != nil && cur.seq >= m.Seq:
			continue // what this process accepted already is as new
		case cur != nil:
			*cur = seen{seq: m.Seq, hash: m.Hash, gone: m.Gone}
		case len(o.seen) >= ingest.MaxObjects:
			dropped = append(dropped, m.Pod)
		default:
			o.seen[m.Pod] = &seen{seq: m.Seq, hash: m.Hash, gone: m.Gone}
		}
	}
	return dropped
}

// validPodKey reports whether k is "namespace/name" of a Pod.
func validPodKey(k string) bool {
	ns, name, ok := strings.Cut(k, "/")
	return ok && len(validation.IsDNS1123Label(ns)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0
}

// remember notes that the memory of Pod k changed, for the next report.
func (o *origin) remember(k string) {
	if o.changed == nil {
		o.changed = map[string]bool{}
	}
	o.changed[k] = true
}

// reportMemory hands what changed in the memory of origin name since the
// last report to Events.Remembered (through out); r.mu is held.
func (r *Relay) reportMemory(name string, o *origin, out *later) {
	if len(o.changed) == 0 {
		return
	}
	changed := o.changed
	o.changed = nil
	ev := r.cfg.Events.Remembered
	if ev == nil {
		return
	}
	var set []Remembered
	var forgotten []string
	for _, k := range slices.Sorted(maps.Keys(changed)) {
		if m := o.seen[k]; m != nil {
			set = append(set, Remembered{Pod: k, Seq: m.seq, Hash: m.hash, Gone: m.gone})
		} else {
			forgotten = append(forgotten, k)
		}
	}
	*out = append(*out, func() { ev(name, set, forgotten) })
}
