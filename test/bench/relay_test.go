package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A relay run's summary renders its figures against the targets, and make
// bench includes it in BENCHMARKS.md as it is.
func TestRelayReport(t *testing.T) {
	rr := &relayResult{Cfg: relayConfig{Services: 10, Endpoints: 3, APIServers: 4, CutFor: 10 * time.Second},
		Origins: 1000, Endpoints: 30000, EdgeBaseHeap: 4e6, EdgeHeap: 10e6, EdgeWatches: 4, EdgeConns: 2,
		QPSOurs: []float64{900}, QPSHosts: []float64{1000}, Prop: []time.Duration{time.Second, 3 * time.Second}, PerFlip: 250,
		PropHub: []time.Duration{time.Second / 2, time.Second}, Solo: []time.Duration{time.Second, 3 * time.Second}, SoloHub: []time.Duration{time.Second / 2, time.Second},
		SoloBytes: 4000, SoloCPU: []cpuShare{{"edge CoreDNS", 2 * time.Millisecond}}, PropCPU: []cpuShare{{"edge CoreDNS", 50 * time.Millisecond}},
		SoloRefused: 996,
		PropBytes:   40000, Resync: time.Second, ResyncBytes: []int64{5000, 6000}, HubHeap: []int64{2e8, 2e8},
		HubGoroutines: []int{3000, 3000}, HubSlices: []int{10000, 10000}, HubWatches: []int{10, 10},
		BurstCPU: []time.Duration{time.Second, time.Second}, BurstChanges: 40, Cold: []time.Duration{100 * time.Millisecond},
		KillProbe: probeCount{Queries: 100}, Command: "go run ./test/bench -relay"}
	dir := t.TempDir()
	if err := writeRelay(rr, dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "relay.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| edge: watches held on the hubs | 4 (over 2 connections) | ≤ 4 (hubs × 2 kinds), not one per origin | met |",
		"| edge: heap per origin endpoint | 200 B", // (10e6-4e6)/30000
		"| edge: QPS ÷ hosts (per-endpoint names, median) | 0.90 (900 ÷ 1000) | ≥ 0.95 | **missed** |",
		"| propagation origin → hub → edge of one origin's change, p50 / p99 | 1000.0 ms / 3000.0 ms (2 flips of a Pod whose export names one origin, each after 2.5s quiet) | p99 ≤ 2 s | **missed** |",
		"| propagation origin → hub → edge of one Pod change in 250 origins at once, p50 / p99 | 1000.0 ms / 3000.0 ms (2 flips, each in 250 origins, each after 2.5s quiet) | p99 ≤ 2 s | **missed** |",
		"| one origin's Pod | 500.0 ms / 1000.0 ms | 1000.0 ms / 3000.0 ms | 1000 B | 2.0 ms |",
		"| one Pod in 250 origins | 500.0 ms / 1000.0 ms | 1000.0 ms / 3000.0 ms | 10000 B | 50.0 ms |",
		"996 refusals (cluster_mismatch)",
		"| per Pod readiness flip | 10000 B per link (40 B per origin endpoint change)",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("relay.md lacks %q:\n%s", want, md)
		}
	}
	r := sample(t)
	if r.Relay, err = readSummary(filepath.Join(dir, "relay.md"), "relay summary"); err != nil {
		t.Fatal(err)
	}
	if err := writeReport(r, r.Cfg.Out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(r.Cfg.Out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "## Relay hubs (`make bench-relay`)") || !strings.Contains(string(b), "| edge: watches held on the hubs | 4") {
		t.Errorf("BENCHMARKS.md lacks the relay summary:\n%s", b)
	}
}
