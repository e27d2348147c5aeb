package harness

import "time"

// StartNoWait starts CoreDNS again after Stop or Kill, with the same Corefile
// on the same port, and returns at once with the time it started the process,
// without sending a query: the test's own first query is then the first one
// the server sees (Start probes with queries of its own until it answers).
// The cleanup registered by StartCoreDNS stops this run too.
func (d *CoreDNS) StartNoWait(t T) time.Time {
	t.Helper()
	if err := PortFree(d.Port); err != nil {
		t.Fatalf("harness: refusing to start CoreDNS: %v", err)
	}
	start := time.Now()
	if err := d.proc.start(); err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Logf("harness: CoreDNS started again as PID %d on %s, not waiting for it to answer", d.proc.PID(), d.Addr())
	return start
}
