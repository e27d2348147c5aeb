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

// One tick of the stale loop with a thousand relayed origins, every one
// connected: what the loop costs each second when nothing changes.
func BenchmarkStaleTickConnectedOrigins(b *testing.B) {
	const n = 1000
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, originLease("hub-1", fmt.Sprintf("o%04d", i), source.Connected, time.Now()))
	}
	hub := fake.NewClientset(objs...)
	old := clientFor
	clientFor = func(string, string) (kubernetes.Interface, error) { return hub, nil }
	defer func() { clientFor = old }()
	tb := newTable(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
	m := &MCS{zones: []string{"clusterset.local."}, table: tb.Table, records: tb.Store, clients: clients.NewIndex()}
	if err := m.newRelay(config{hubs: []peerConfig{{name: "hub-1", kubeconfig: "/hub-1"}}}, "edge-a"); err != nil {
		b.Fatal(err)
	}
	m.origins.started = time.Now()
	if err := m.relay.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = m.relay.Stop() }()
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
