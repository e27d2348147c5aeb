package mcsannotations

// Ready implements the ready plugin's Readiness interface: ready once the
// snapshot held a complete list of some source, or once every source has
// applied its first complete list.
func (m *MCS) Ready() bool {
	if m.snapshotLoaded.Load() {
		return true
	}
	for _, s := range m.sources {
		if !s.HasSynced() {
			return false
		}
	}
	return true
}
