package mcsannotations

// Ready implements the ready plugin's Readiness interface: ready once the
// snapshot held a complete list of some source (it then also held the local
// Pods as DNS clients), or once every source and every hub has applied its
// first complete list and the local Pods (the importers, or all of them with
// imports enforce) are indexed, so that no alias or enforce answer is given
// before the client is known.
func (m *MCS) Ready() bool {
	if m.snapshotLoaded.Load() {
		return true
	}
	for _, s := range m.sources {
		if !s.HasSynced() {
			return false
		}
	}
	return m.hubsSynced() && m.watcher.HasSynced()
}
