package table

import (
	"strings"
	"testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// OnUnencodable is called once per new or changed record whose endpoint name
// cannot be encoded, from Upsert and ReplaceCluster alike, and with the
// table's lock released: the plugin logs there, and a slow log must not
// hold up every reader and writer of the table. The callback takes the lock
// itself (TryLock) to see it free; it fails when reported under the lock.
func TestUnencodableReportedUnlocked(t *testing.T) {
	tb := newTable(cfg())
	long := strings.Repeat("c", 100) // a cluster ID label of 100 octets
	var got []string
	tb.OnUnencodable(func(p *store.Pod, e annotation.Export) {
		if !tb.mu.TryLock() {
			t.Errorf("%s/%s reported with the table's lock held", p.Name, e.Name)
		} else {
			tb.mu.Unlock()
		}
		got = append(got, p.Name+"/"+e.Name)
	})
	tb.Upsert(pod(long, "default", "far", "", true, []string{"10.0.0.1"}, export("backend")))
	tb.Upsert(pod("edge-a", "default", "near", "", true, []string{"10.0.0.2"}, export("backend")))
	tb.Upsert(pod(long, "default", "far", "", true, []string{"10.0.0.1"}, export("backend"))) // unchanged: not again
	// No address and no hostname yet (a Pod just created): no endpoint
	// name at all, so nothing to report (it was reported as unencodable).
	tb.Upsert(pod("edge-a", "default", "pending", "", false, nil, export("backend")))
	tb.ReplaceCluster(long, []*store.Pod{
		pod(long, "default", "far", "", true, []string{"10.0.0.1"}, export("backend")),                // unchanged
		pod(long, "default", "far2", "", true, []string{"10.0.0.3"}, export("backend"), export("db")), // new: two exports
	})
	want := []string{"far/backend", "far2/backend", "far2/db"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("reported %v, want %v", got, want)
	}
	if len(tb.named) != 0 {
		t.Errorf("%d reports left pending", len(tb.named))
	}
}
