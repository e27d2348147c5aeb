package relay

import (
	"fmt"

	"github.com/mcsannotations/mcsannotations/internal/snapshot"
)

// The replay memory in a snapshot file (internal/snapshot's replay
// bucket): CoreDNS's snapshot and the MCS controller's keep it alike, so
// that after a restart a hub presenting a statement older than one
// accepted before (a deleted Pod's too, until TombstoneTTL) is still
// refused.

// SeedSnapshot seeds the replay memory from st, before the Relay starts
// (SeedMemory). What it does not take (no verify, no key for the origin,
// relayed records of the origin ignored, expired tombstones, past the
// bound) is forgotten from the file. debugf says, per origin, what is
// remembered and what forgotten, and logf the sum in one line (a thousand
// origins would be a thousand lines at every start). It returns how many
// entries did not decode (skipped) and an error of the load.
func (r *Relay) SeedSnapshot(st *snapshot.Store, logf, debugf func(format string, args ...any)) (bad int, err error) {
	var origins, kept, forgot, dropped int
	bad, err = st.LoadReplay(func(origin string, mem []snapshot.Replay) {
		rs := make([]Remembered, len(mem))
		for i, m := range mem {
			rs[i] = Remembered(m)
		}
		gone := r.SeedMemory(origin, rs)
		if len(gone) == len(mem) {
			debugf("snapshot: forgetting the replay memory of origin %s (not relayed under verify, or nothing left to remember)", origin)
			st.DropReplay(origin)
			dropped++
			return
		}
		for _, pod := range gone {
			st.DeleteReplay(origin, pod)
		}
		origins++
		kept += len(mem) - len(gone)
		forgot += len(gone)
		debugf("snapshot: origin %s: remembering %d relayed statements (replay memory), %d forgotten", origin, len(mem)-len(gone), len(gone))
	})
	if origins+dropped > 0 {
		line := fmt.Sprintf("snapshot: remembering %d relayed statements of %d origins (replay memory), %d forgotten", kept, origins, forgot)
		if dropped > 0 {
			line += fmt.Sprintf("; forgetting the replay memory of %d origins (not relayed under verify, or nothing left to remember)", dropped)
		}
		logf("%s", line)
	}
	return bad, err
}

// JournalSnapshot returns an Events.Remembered hook that queues each change
// of an origin's replay memory into the file file returns (none while it
// returns nil), for its next batch write.
func JournalSnapshot(file func() *snapshot.Store) func(origin string, set []Remembered, forgotten []string) {
	return func(origin string, set []Remembered, forgotten []string) {
		st := file()
		if st == nil {
			return
		}
		for _, r := range set {
			st.PutReplay(origin, snapshot.Replay(r))
		}
		for _, pod := range forgotten {
			st.DeleteReplay(origin, pod)
		}
	}
}

// SnapshotMemory is origin's replay memory in the snapshot's form.
func (r *Relay) SnapshotMemory(origin string) []snapshot.Replay {
	mem := r.Memory(origin)
	out := make([]snapshot.Replay, len(mem))
	for i, m := range mem {
		out[i] = snapshot.Replay(m)
	}
	return out
}
