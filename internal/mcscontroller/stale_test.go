package mcscontroller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// withPolicy sets the stale policy of p's export entries.
func withPolicy(p *store.Pod, policy string, grace time.Duration) *store.Pod {
	for i := range p.Exports {
		p.Exports[i].StaleEndpoints = policy
		p.Exports[i].StaleGraceSeconds = int32(grace / time.Second)
	}
	return p
}

// The stale policy's matrix on the EndpointSlices, as the DNS answers have
// it (internal/table TestStalePolicy): each policy of peer b's export, with
// b connected, out of contact within its grace and past it, with and
// without ready endpoints in the local cluster a; and the same once the
// controller restarted while b is cut, its records restored from the
// snapshot (restart "snapshot"). Restarted without a snapshot (restart
// "bare"), b's share is not known: its slices are held as they are, no
// stale policy drops them.
func TestStalePolicySlices(t *testing.T) {
	const grace = 30 * time.Second
	for _, policy := range []string{annotation.StaleServe, annotation.StaleDrop, annotation.StaleDropIfLocal} {
		for _, out := range []time.Duration{0, grace - 10*time.Second, grace + 10*time.Second} {
			for _, local := range []bool{false, true} {
				for _, restarted := range []string{"", "snapshot", "bare"} {
					name := fmt.Sprintf("%s/out=%s/local=%t/restart=%s", policy, out, local, restarted)
					t.Run(name, func(t *testing.T) {
						testStalePolicySlices(t, policy, grace, out, local, restarted)
					})
				}
			}
		}
	}
}

func testStalePolicySlices(t *testing.T, policy string, grace, out time.Duration, local bool, restarted string) {
	now := time.Now()
	a, b := newSource("a", true, now), newSource("b", true, now)
	e := newEnv(t, Config{}, []*fakeSource{a, b})
	if policy == annotation.StaleServe {
		grace = 0
	}
	e.table.Upsert(withPolicy(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP), policy, grace))
	if local {
		e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	}
	e.start(false)
	e.waitSynced()
	e.ctl.started = now.Add(-time.Hour) // the controller has run long before the cut
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if len(e.slicesBy("web")["b"]) != 1 {
		t.Fatalf("connected: b's slices %v", e.slicesBy("web"))
	}

	if out > 0 {
		b.cut.Store(true)
		b.setLast(now.Add(-out))
	}
	switch restarted {
	case "snapshot":
		// b's records are the snapshot's, its last contact the file's.
		b.synced.Store(false)
		e.ctl.cfg.Restored = map[string]bool{"b": true}
		e.ctl.started = now.Add(-time.Minute)
	case "bare":
		b.synced.Store(false)
		e.table.ReplaceCluster("b", nil)
		if out > 0 {
			b.setLast(time.Time{}) // a new controller never heard from it: out of contact since its start
			e.ctl.started = now.Add(-out)
		}
	}
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	dropped := out > grace && (policy == annotation.StaleDrop || policy == annotation.StaleDropIfLocal && local) && restarted != "bare"
	if got := len(e.slicesBy("web")["b"]) == 0; got != dropped {
		t.Errorf("b's slices dropped: %t, want %t (slices %v)", got, dropped, e.slicesBy("web"))
	}
	im := e.serviceImport("web")
	switch {
	case !local && dropped:
		if im != nil {
			t.Errorf("b's share dropped and no other: the import remains: %v", importClusters(im))
		}
	case im == nil:
		t.Errorf("no import")
	case slices.Contains(importClusters(im), "b") == dropped:
		t.Errorf("import clusters %v, b dropped: %t", importClusters(im), dropped)
	}

	// In contact again: b's share is back.
	b.cut.Store(false)
	b.setLast(time.Now())
	if restarted != "" {
		b.synced.Store(true)
		e.table.Upsert(withPolicy(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP), policy, grace))
	}
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if len(e.slicesBy("web")["b"]) != 1 {
		t.Errorf("in contact again: b's slices %v", e.slicesBy("web"))
	}
}

// A peer cut within its grace loses its share when the grace passes,
// without any other change (the controller looks again then), with a
// Normal Event saying why.
func TestStalePolicyGracePasses(t *testing.T) {
	now := time.Now()
	a, b := newSource("a", true, now), newSource("b", true, now)
	rec := record.NewFakeRecorder(10)
	e := newEnv(t, Config{Recorder: rec}, []*fakeSource{a, b})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(withPolicy(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP), annotation.StaleDrop, 7*time.Second))
	e.start(false)
	e.waitSynced()
	e.ctl.started = now.Add(-time.Hour)
	b.cut.Store(true)
	b.setLast(time.Now().Add(-6 * time.Second)) // out of contact for 6 s of its 7
	go e.ctl.RunLoop(e.ctx)
	e.poll("b's slices to go when its grace passes", func() bool {
		return len(e.slicesBy("web")["a"]) == 1 && len(e.slicesBy("web")["b"]) == 0
	})
	select {
	case ev := <-rec.Events:
		if !strings.HasPrefix(ev, "Normal "+reasonStaleDropped) || !strings.Contains(ev, "drop-after=7s") {
			t.Errorf("event %q", ev)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("no event")
	}
}
