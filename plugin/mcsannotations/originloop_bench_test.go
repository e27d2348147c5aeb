package mcsannotations

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// connectedOrigins is a plugin whose relay reads one fake hub relaying n
// origins, every one connected, once the relay has taken them all.
func connectedOrigins(b *testing.B, n int) *MCS {
	b.Helper()
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, originLease("hub-1", fmt.Sprintf("o%04d", i), source.Connected, time.Now()))
	}
	hub := fake.NewClientset(objs...)
	old := clientFor
	clientFor = func(string, string) (kubernetes.Interface, error) { return hub, nil }
	b.Cleanup(func() { clientFor = old })
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
	m := &MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}
	if err := m.newRelay(config{hubs: []peerConfig{{name: "hub-1", kubeconfig: "/hub-1"}}}, "edge-a"); err != nil {
		b.Fatal(err)
	}
	m.origins.started = time.Now()
	if err := m.relay.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.relay.Stop() })
	for deadline := time.Now().Add(time.Minute); ; {
		connected := 0
		for _, o := range m.relay.Origins() {
			if o.State == source.Connected {
				connected++
			}
		}
		if connected == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d origins connected after a minute", connected, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return m
}

// One tick of the stale loop with a thousand relayed origins, every one
// connected: what the loop costs each second when nothing changes.
func BenchmarkStaleTickConnectedOrigins(b *testing.B) {
	m := connectedOrigins(b, 1000)
	tick := func(now time.Time) { // staleLoop's
		m.passOrigins(now)
		m.applyStalePolicies(now)
	}
	tick(time.Now()) // the first pass takes every origin
	b.ResetTimer()
	for b.Loop() {
		tick(time.Now())
	}
}

// The stale loop's first pass over a thousand relayed origins, each new to
// the plugin (as at a start from a snapshot): the set of origins is copied
// once for the pass, not once per origin.
func BenchmarkFirstPassOrigins(b *testing.B) {
	m := connectedOrigins(b, 1000)
	for b.Loop() {
		b.StopTimer()
		m.origins.mu.Lock()
		m.origins.cur.Store(nil)
		m.origins.lagging, m.origins.pass = nil, time.Time{}
		m.origins.down.Store(0)
		m.origins.mu.Unlock()
		b.StartTimer()
		m.passOrigins(time.Now())
	}
	if got := len(m.origins.cur.Load().by); got != 1000 {
		b.Fatalf("%d origins taken, want 1000", got)
	}
}
