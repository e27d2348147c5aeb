package mcsannotations

// Ready implements the ready plugin's Readiness interface: ready once every
// source has applied its first complete list. (With a snapshot, loading it
// is enough: see the offline work.)
func (m *MCS) Ready() bool {
	for _, s := range m.sources {
		if !s.HasSynced() {
			return false
		}
	}
	return true
}
