package main

import (
	"slices"
	"testing"
	"time"
)

// The snapshot's share of a cold start is the median of each cold start less
// the empty start timed just before it, not the difference of the medians:
// a slow moment slows both starts of a pair.
func TestSnapshotShare(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x)*time.Millisecond)
		}
		return ds
	}
	c := coldRun{Runs: ms(300, 250, 400), EmptyRuns: ms(100, 60, 190)}
	// Pairs differ by 200, 190, 210: median 200.
	if d, ok := c.snapshotShare(); !ok || d != 200*time.Millisecond {
		t.Errorf("share %v, %v; want 200ms", d, ok)
	}
	c = coldRun{Runs: ms(300, 260, 400), EmptyRuns: ms(150, 60, 200)}
	// Pairs: 150, 200, 200 -> 200; medians: 300 - 150 = 150.
	if d, ok := c.snapshotShare(); !ok || d != 200*time.Millisecond {
		t.Errorf("share %v, %v; want 200ms (the median of the pairs)", d, ok)
	}
	for _, c := range []coldRun{{}, {Runs: ms(300, 250), EmptyRuns: ms(100)}} {
		if d, ok := c.snapshotShare(); ok {
			t.Errorf("%+v: share %v from unpaired runs", c, d)
		}
	}
}

// The relist check reads the data cluster's "listed N Pods again" lines of
// CoreDNS's log, not the other sources' (their lists go through the same
// proxy: bytes alone cannot tell).
func TestListedPods(t *testing.T) {
	log := `[INFO] plugin/mcsannotations: serviceimports: listed 60 ServiceImports again in 16ms
[INFO] plugin/mcsannotations: clients: listed 0 Pods again in 11ms
[INFO] plugin/mcsannotations: cluster/bench-b: listed 7 Pods again in 3ms
[INFO] plugin/mcsannotations: cluster/bench-a: listed 123 Pods again in 15ms
[INFO] plugin/mcsannotations: cluster/bench-a: listed 124 Pods again in 1.2s
`
	if got := listedPods(log); !slices.Equal(got, []int{123, 124}) {
		t.Errorf("listedPods: %v, want [123 124]", got)
	}
	if got := listedPods("[INFO] plugin/mcsannotations: clients: listed 0 Pods again in 11ms\n"); len(got) != 0 {
		t.Errorf("listedPods of the clients' list: %v", got)
	}
}
